"""`pax` commands forked from the fork server are processes of their own, as from a shell: the
caller's environment, working directory and devices, their own output and exit status, killed
by signals; a command whose start-up variables differ runs in a new interpreter."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from pax_core.testing import cpu_xla_flags, run_pax
from pax_core.testing.forked import ForkedCommand, run_command, start_command


def test_a_forked_command_has_the_callers_environment_directory_and_its_own_output(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PAX_PLUGINS", "lm")  # only pax-lm of the installed plugins
    done = run_command(["plugins", "--json"], timeout=60)
    assert done.returncode == 0, done.stderr
    active = {p["name"] for p in json.loads(done.stdout)["plugins"] if p["status"] == "active"}
    assert "lm" in active and "vision" not in active
    missing = run_command(["train", "--exp", "NoSuchExperiment", "--job-dir", "job"], timeout=60)
    assert missing.returncode == 2 and missing.stdout == ""
    assert "unknown experiment 'NoSuchExperiment'" in missing.stderr
    assert not (tmp_path / "job").exists()


def test_a_forked_run_sees_the_devices_its_environment_asks_for(tmp_path):
    job = tmp_path / "job"
    env = {**os.environ, "XLA_FLAGS": cpu_xla_flags(2)}
    done = run_command(["train", "--exp", "MlpSynthetic", "--set", "NUM_TRAIN_STEPS=2",
                       "--job-dir", str(job)], env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    start = json.loads((job / "metrics.jsonl").read_text().splitlines()[0])
    assert start["num_devices"] == 2, start


def test_sigkill_ends_a_forked_command_with_minus_nine(tmp_path):
    out = tmp_path / "out"
    command = start_command(["train", "--exp", "MlpSynthetic", "--set", "NUM_TRAIN_STEPS=100000",
                            "--job-dir", str(tmp_path / "job")], stdout=out, stderr=out)
    assert isinstance(command, ForkedCommand)
    with pytest.raises(subprocess.TimeoutExpired):
        command.wait(timeout=0.5)
    assert command.poll() is None
    os.kill(command.pid, 0)  # a process of its own, which this one may signal
    command.kill()
    assert command.wait(timeout=30) == -signal.SIGKILL


def test_a_command_with_other_start_up_variables_runs_in_a_new_interpreter(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    out = tmp_path / "out"
    command = start_command(["--version"], stdout=out, stderr=out)
    assert isinstance(command, subprocess.Popen)
    assert command.wait(timeout=60) == 0
    assert out.read_text().strip()


def test_run_pax_returns_what_the_forked_command_printed_and_its_status():
    done = run_pax("--version")
    assert done.returncode == 0 and done.stdout.startswith("pax ") and done.stderr == ""
    assert done.args[1:] == ["--version"]
