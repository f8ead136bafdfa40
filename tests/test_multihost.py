"""Multi-process runs: real processes on 127.0.0.1 through `pax launch`, 2 processes x 4 CPU
devices against 1 process x 8."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pax_core.errors import UsageError
from pax_core.parallel.processes import DistributedOptions, detected_cluster

PAX = str(Path(sys.executable).with_name("pax"))
TRAIN = ["pax", "train", "--exp", "TinyCounting", "--set", "NUM_TRAIN_STEPS=20"]
SLURM = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "node[01-02]", "SLURM_PROCID": "0",
         "SLURM_LOCALID": "0"}


def _environ(**extra: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PAX_")}
    return {**environ, "PAX_STRICT_PLUGINS": "1", **extra}


def _launch(*command: str, timeout: float = 50, **env: str) -> subprocess.CompletedProcess:
    """``command`` as 2 processes x 4 CPU devices."""
    return subprocess.run([PAX, "launch", "--processes", "2", "--cpu-devices", "4", "--",
                           *command], capture_output=True, text=True, timeout=timeout,
                          env=_environ(**env))


def _plugin_site(site: Path, name: str, source: str = "") -> Path:
    """A directory that, on PYTHONPATH, installs the plugin ``name`` (distribution pax-<name>)."""
    dist = site / f"pax_{name}-0.3.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: pax-{name}\nVersion: 0.3.0\n")
    (dist / "entry_points.txt").write_text(f"[pax]\n{name} = pax_{name}_plugin\n")
    (site / f"pax_{name}_plugin.py").write_text(textwrap.dedent(source))
    return site


def _lines(job_dir: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (job_dir / name).read_text().splitlines()]


def _per_process(output: str, index: int) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(f"[p{index}] ")]


@pytest.fixture(scope="module")
def two_process_job(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """TinyCounting for 20 steps as 2 processes x 4 devices."""
    job_dir = tmp_path_factory.mktemp("two") / "job"
    result = _launch(*TRAIN, "--job-dir", str(job_dir))
    assert result.returncode == 0, result.stderr
    return job_dir, result


def test_two_processes_train_as_one_process_with_as_many_devices(two_process_job, tmp_path):
    job_dir, launched = two_process_job
    # One process with the 8 devices conftest.py gives every test.
    single = subprocess.run([PAX, *TRAIN[1:], "--job-dir", str(tmp_path / "one")],
                            capture_output=True, text=True, timeout=50, env=_environ())
    assert single.returncode == 0, single.stderr
    two, one = _lines(job_dir, "metrics.jsonl"), _lines(tmp_path / "one", "metrics.jsonl")
    assert [(r["step"], r["kind"]) for r in two] == [(r["step"], r["kind"]) for r in one] == [
        (0, "start"), (10, "train"), (20, "train"), (20, "eval/test")]
    for a, b in zip(two[1:], one[1:], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)

    # Process 0 alone wrote the record and the metrics, and printed the summaries.
    assert len(_lines(job_dir, "runs.jsonl")) == 1
    assert _per_process(launched.stdout, 1) == []
    step_lines = [line for line in launched.stdout.splitlines() if " step 10/20 " in line]
    assert len(step_lines) == 1 and step_lines == [
        line for line in _per_process(launched.stdout, 0) if " step 10/20 " in line]
    assert "Gloo" not in launched.stdout + launched.stderr


def test_two_process_run_resumes_and_evaluates_once(two_process_job, tmp_path):
    job_dir = tmp_path / "job"
    shutil.copytree(two_process_job[0], job_dir)
    resumed = _launch(*TRAIN, "--job-dir", str(job_dir), "--set", "NUM_TRAIN_STEPS=30")
    assert resumed.returncode == 0, resumed.stderr
    assert "[p0] testplugin/TinyCounting: resuming from step 20 of 30" in resumed.stdout
    assert [r["step"] for r in _lines(job_dir, "metrics.jsonl") if r["kind"] == "train"] == [
        10, 20, 30]
    assert sorted(p.name for p in (job_dir / "checkpoints").iterdir()) == ["20", "30"]

    evaluated = _launch("pax", "eval", "--job-dir", str(job_dir))
    assert evaluated.returncode == 0, evaluated.stderr
    # Printed once, by process 0 (other lines can be the runtime's own connection notices).
    [line] = [line for line in evaluated.stdout.splitlines() if " eval/" in line]
    assert line.startswith("[p0] step 30 eval/test accuracy=")


def test_processes_with_different_plugins_stop_with_one_message(tmp_path):
    site = _plugin_site(tmp_path / "site", "extra")
    only_on_1 = (f'if [ "$PAX_PROCESS_ID" = 1 ]; then export PYTHONPATH={site}; fi; '
                 f'exec {PAX} {" ".join(TRAIN[1:])} --job-dir {tmp_path / "job"}')
    result = _launch("sh", "-c", only_on_1)
    assert result.returncode == 2
    message = ("pax: error: the processes of this run loaded different software: plugin extra is "
               "not loaded on process 0, pax-extra 0.3.0 on process 1; install the same plugins "
               "and versions on every host, with the same PAX_PLUGINS/PAX_DISABLE_PLUGINS")
    processes = sorted(line for line in result.stderr.splitlines() if line.startswith("[p"))
    assert processes == [f"[p0] {message}", f"[p1] {message}"]
    assert not (tmp_path / "job").exists()


def test_a_dead_process_ends_the_launch(tmp_path):
    site = _plugin_site(tmp_path / "site", "killer", """
        import os, signal
        from pax_core import hookimpl

        @hookimpl
        def pax_on_metrics(run, step, kind, metrics):
            if run.process_index == 1 and step == 10:
                os.kill(os.getpid(), signal.SIGKILL)
    """)
    start = time.monotonic()
    result = _launch(*TRAIN, "--job-dir", str(tmp_path / "job"), PYTHONPATH=str(site))
    assert result.returncode == 128 + 9, result.stderr
    assert time.monotonic() - start < 40
    assert "pax launch: process 1 was killed by signal 9; stopping the others" in result.stderr
    assert max(r["step"] for r in _lines(tmp_path / "job", "metrics.jsonl")) == 10


def test_a_process_that_cannot_start_ends_the_launch(tmp_path):
    bad_on_1 = ('if [ "$PAX_PROCESS_ID" = 1 ]; then set -- --exp TinyCountng; fi; '
                f'exec {PAX} {" ".join(TRAIN[1:])} --job-dir {tmp_path / "job"} "$@"')
    result = _launch("sh", "-c", bad_on_1, timeout=30)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "[p1] pax: error: unknown experiment 'TinyCountng'; closest: TinyCounting",
        "pax launch: process 1 exited with 2; stopping the others"]


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--num-processes", "2"], {},
     "--num-processes without --coordinator-address (or PAX_COORDINATOR_ADDRESS) and "
     "--process-id (or PAX_PROCESS_ID): a multi-process run needs all three"),
    (["--coordinator-address", "10.0.0.1", "--num-processes", "2", "--process-id", "0"], {},
     "--coordinator-address must be HOST:PORT (process 0's host and a free port), "
     "got '10.0.0.1'"),
    ([], {"PAX_COORDINATOR_ADDRESS": "10.0.0.1:1234", "PAX_NUM_PROCESSES": "2",
          "PAX_PROCESS_ID": "2"},
     "PAX_PROCESS_ID must be below the number of processes (2), got 2"),
])
def test_bad_distributed_options_are_one_line(tmp_path, args, env, message):
    result = subprocess.run([PAX, *TRAIN[1:], "--job-dir", str(tmp_path / "job"), *args],
                            capture_output=True, text=True, timeout=50, env=_environ(**env))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [f"pax: error: {message}"]
    assert not (tmp_path / "job").exists()


def test_a_taken_coordinator_port_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = subprocess.run(
            [PAX, *TRAIN[1:], "--job-dir", str(tmp_path / "job"), "--coordinator-address",
             address, "--num-processes", "2", "--process-id", "0"],
            capture_output=True, text=True, timeout=50, env=_environ())
    assert result.returncode == 2
    assert result.stderr.startswith(f"pax: error: --coordinator-address {address}: port ")
    assert len(result.stderr.splitlines()) == 1


def test_bad_launch_options_are_one_line():
    for args, message in [
        (["--processes", "0", "--", "pax"], "--processes must be an integer >= 1, got '0'"),
        (["--processes", "2"], "pax launch needs the command to run after --, such as: "
         "pax launch --processes 2 -- pax train --exp ... --job-dir ..."),
        (["--processes", "2", "--", "no-such-program"],
         "pax launch: cannot run 'no-such-program': no such program"),
    ]:
        result = subprocess.run([PAX, "launch", *args], capture_output=True, text=True,
                                timeout=30, env=_environ())
        assert result.returncode == 2
        assert result.stderr.splitlines() == [f"pax: error: {message}"]


def test_options_fall_back_to_the_environment_and_the_command_line_wins(monkeypatch):
    monkeypatch.setenv("PAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    monkeypatch.setenv("PAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("PAX_PROCESS_ID", "3")
    assert DistributedOptions.parse() == DistributedOptions("10.0.0.1:1234", 4, 3)
    assert DistributedOptions.parse(process_id="1") == DistributedOptions("10.0.0.1:1234", 4, 1)
    with pytest.raises(UsageError, match="--num-processes must be an integer >= 1, got 'x'"):
        DistributedOptions.parse(num_processes="x")


def test_one_process_alone_needs_nothing_else(monkeypatch):
    for name in ("PAX_COORDINATOR_ADDRESS", "PAX_NUM_PROCESSES", "PAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    assert DistributedOptions.parse() == DistributedOptions()
    assert DistributedOptions.parse(num_processes="1") == DistributedOptions(num_processes=1)
    with pytest.raises(UsageError, match="--process-id without --coordinator-address"):
        DistributedOptions.parse(process_id="0")


def test_a_cluster_is_joined_only_with_several_processes(monkeypatch):
    for name, value in SLURM.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_NTASKS", "1")
    assert detected_cluster() is None
    monkeypatch.setenv("SLURM_NTASKS", "2")
    assert detected_cluster() == "slurm cluster"
    monkeypatch.delenv("SLURM_JOB_ID")
    assert detected_cluster() is None


def test_launch_drops_gloo_messages_and_their_fragments_only():
    import io
    import threading

    from pax_core.launchers.supervise import Child, _forward

    written = (b"before\n[Gloo] Rank 1 is connected to 1 peer ranks. Expected number of connected "
               b"peer ranks is : \n1\n\nafter\n\n7\n")
    out = io.StringIO()
    _forward(io.BytesIO(written), out, Child("p1", "process 1", [], {}), threading.Lock())
    assert out.getvalue().splitlines() == ["[p1] before", "[p1] after", "[p1] ", "[p1] 7"]


def _child_with_index(launcher: subprocess.Popen, index: int, timeout: float = 60) -> int:
    """The pid of the launched process ``index`` (its PAX_PROCESS_ID)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for child in Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split():
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{child}/environ").read_bytes().split(b"\0")
                if f"PAX_PROCESS_ID={index}".encode() in environ:
                    return int(child)
        time.sleep(0.1)
    raise AssertionError(f"process {index} did not start")


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("target, signum", [("process 1", signal.SIGTERM),
                                            ("launcher", signal.SIGINT)])
def test_a_stop_request_stops_every_process_at_the_same_step(tmp_path, target, signum):
    job = tmp_path / "job"
    launcher = subprocess.Popen(
        [PAX, "launch", "--processes", "2", "--cpu-devices", "4", "--", "pax", "train",
         "--exp", "TinyCounting", "--set", "NUM_TRAIN_STEPS=1000000", "--job-dir", str(job)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_environ())
    second = _child_with_index(launcher, 1)
    deadline = time.monotonic() + 120
    while not (job / "metrics.jsonl").exists() or '"train"' not in (
            job / "metrics.jsonl").read_text():
        assert time.monotonic() < deadline and launcher.poll() is None, launcher.communicate()
        time.sleep(0.1)
    os.kill(second if target == "process 1" else launcher.pid, signum)
    _, err = launcher.communicate(timeout=120)
    assert launcher.returncode == 128 + signum, err
    assert "Traceback" not in err and "stopping the others" not in err, err
    stops = sorted(line for line in err.splitlines() if "stopped on request" in line)
    assert len(stops) == 2, err
    steps = {int(line.split(" at step ")[1].split(";")[0]) for line in stops}
    assert len(steps) == 1, stops
    [step] = steps
    assert stops[0].startswith("[p0] pax: stopped on request (SIGTERM) at step ")
    assert max(int(p.name) for p in (job / "checkpoints").iterdir() if p.name.isdigit()) == step
    resumed = _launch(*TRAIN[:-1], f"NUM_TRAIN_STEPS={step + 10}", "--job-dir", str(job))
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from step {step} of {step + 10}" in resumed.stdout


def test_a_one_host_tpu_vm_without_a_metadata_server_is_one_process(monkeypatch):
    """A one-host TPU VM (one chip, v5litepod-4 or smaller) lists itself as its only worker and
    may have no metadata server: every command must start there with no flags."""
    from jax._src.clusters import cloud_tpu_cluster

    monkeypatch.setattr(cloud_tpu_cluster, "running_in_cloud_tpu_vm", True)
    monkeypatch.setenv("GCE_METADATA_IP", "127.0.0.1:9")  # any metadata query fails at once
    for name in ("TPU_PROCESS_ADDRESSES", "MEGASCALE_NUM_SLICES", *SLURM):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TPU_SKIP_MDS_QUERY", "true")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")
    monkeypatch.setenv("TPU_HOST_BOUNDS", "1,1,1")
    assert detected_cluster() is None
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "t1v-0,t1v-1")
    assert detected_cluster() == "gketpu cluster"
    monkeypatch.setenv("MEGASCALE_NUM_SLICES", "2")
    monkeypatch.setenv("TPU_WORKER_HOSTNAMES", "localhost")
    assert detected_cluster() == "gketpu cluster"
