"""More mistakes a user makes on the command line, each refused in seconds with one line, exit 2
(1 for a plugin's broken experiment module, as for its other import failures) and nothing
changed: impossible ``pax plan`` sizes, an empty or one-slash ``--job-dir``, a ``train.lock``
that is a directory, an experiment module that exits while it is imported; and the coordinator
``pax launch`` starts listens on the loopback interface only."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pax_core.testing import run_pax

PAX = str(Path(sys.executable).with_name("pax"))
MLP = ["--exp", "MlpSynthetic"]


def _one_line(result: subprocess.CompletedProcess, code: int = 2) -> str:
    assert result.returncode == code, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


IMPOSSIBLE_SIZES = [
    (["--devices", "0"], "--devices must be 1 or more, got 0"),
    (["--devices", "-3"], "--devices must be 1 or more, got -3"),
    (["--hbm-gib", "-1"], "--hbm-gib must be a finite number above 0, got -1.0"),
    (["--hbm-gib", "0"], "--hbm-gib must be a finite number above 0, got 0.0"),
    (["--hbm-gib", "nan"], "--hbm-gib must be a finite number above 0, got nan"),
    (["--hbm-gib", "inf"], "--hbm-gib must be a finite number above 0, got inf"),
]


@pytest.mark.parametrize(("args", "message"), [IMPOSSIBLE_SIZES[0], IMPOSSIBLE_SIZES[4]],
                         ids=["devices", "hbm-gib"])
def test_plan_refuses_impossible_sizes(args, message):
    """One size of each option through the ``pax`` command: one line, exit 2."""
    assert _one_line(run_pax("plan", *MLP, *args, timeout=60)) == f"pax: error: {message}"


def test_plan_refuses_each_impossible_size_before_planning():
    """Every impossible size, through pax's own app in this process (typer's runner): the usage
    error that the ``pax`` command prints in one line and exits 2 with (the test above)."""
    from typer.testing import CliRunner

    from pax_core.cli.app import build_app
    from pax_core.errors import UsageError
    from pax_core.testing import isolated_host

    host = isolated_host()
    app = build_app(host)
    for args, message in IMPOSSIBLE_SIZES:
        result = CliRunner().invoke(app, ["plan", *MLP, *args], obj=host)
        assert isinstance(result.exception, UsageError), (args, result.output, result.exception)
        assert (str(result.exception), result.exception.exit_code) == (message, 2)


@pytest.mark.parametrize("command", [
    ["train", *MLP], ["eval"], ["export", "--output", "out"],
])
def test_an_empty_job_dir_is_refused(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # what an empty path would have meant
    line = _one_line(run_pax(*command, "--job-dir", "", timeout=60))
    assert line == "pax: error: --job-dir is empty; give a directory's path (nothing was changed)"
    assert list(tmp_path.iterdir()) == []


def test_an_empty_export_output_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    line = _one_line(run_pax("export", "--job-dir", str(tmp_path / "job"), "--output", "",
                             timeout=60))
    assert line == "pax: error: --output is empty; give a directory's path (nothing was changed)"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("job_dir", ["gs:/bucket/job", "s3:/bucket/job", "gs:"])
def test_a_url_with_one_slash_is_refused(job_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where the folder 'gs:' would have been made
    line = _one_line(run_pax("train", *MLP, "--job-dir", job_dir, timeout=60))
    assert line == (f"pax: error: --job-dir {job_dir} looks like a URL without its '//'; a "
                    f"bucket is written gs://BUCKET/PATH (nothing was changed)")
    assert list(tmp_path.iterdir()) == []


def test_a_lock_that_is_a_directory_is_one_line(tmp_path):
    job = tmp_path / "job"
    (job / "train.lock").mkdir(parents=True)
    (job / "train.lock" / "notes.txt").write_text("mine")
    line = _one_line(run_pax("train", *MLP, "--job-dir", str(job), timeout=60))
    assert line == (f"pax: error: {job / 'train.lock'} is a directory, where pax keeps a lock "
                    f"file; move it away or remove it, then run again (nothing was changed)")
    assert (job / "train.lock" / "notes.txt").read_text() == "mine"
    assert not (job / "checkpoints").exists()


EXITING = """
    import sys

    from pax_core import SingleTaskExperiment


    class Exits(SingleTaskExperiment):
        pass


    sys.exit(3)
"""


def test_a_users_module_that_exits_on_import_is_one_line(tmp_path):
    (tmp_path / "exits.py").write_text(textwrap.dedent(EXITING))
    line = _one_line(run_pax("train", "--exp", f"{tmp_path / 'exits.py'}:Exits",
                             "--job-dir", str(tmp_path / "job"), timeout=60))
    assert line == (f"pax: error: --exp {tmp_path / 'exits.py'}:Exits: importing "
                    f"{tmp_path / 'exits.py'} failed: it exited while being imported "
                    f"(sys.exit(3))")
    assert not (tmp_path / "job").exists()


def test_a_plugins_experiment_module_that_exits_on_import_is_one_line(tmp_path, monkeypatch):
    site = tmp_path / "site"
    dist = site / "pax_exiting-0.1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pax-exiting\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[pax]\nexiting = pax_exiting_plugin\n")
    (site / "pax_exiting_plugin.py").write_text(textwrap.dedent("""
        from pax_core import ExperimentRef, hookimpl

        PAX_API = ">=1.0,<2"

        @hookimpl
        def pax_register_experiments():
            return [ExperimentRef("Exits", "pax_exiting_experiments:Exits")]
    """))
    (site / "pax_exiting_experiments.py").write_text(textwrap.dedent(EXITING))
    monkeypatch.setenv("PYTHONPATH", str(site))
    for command in (["train", "--exp", "Exits", "--job-dir", str(tmp_path / "job")],
                    ["plan", "--exp", "Exits"]):
        line = _one_line(run_pax(*command, timeout=60), code=1)
        assert line == ("pax: error: experiment 'exiting/Exits' could not be loaded from "
                        "pax_exiting_experiments:Exits: it exited while being imported "
                        "(sys.exit(3))")
    assert not (tmp_path / "job").exists()


# Process 0 lists the sockets listening on the coordinator's port once the processes joined.
LISTENERS = """
import ipaddress
import os

import jax

from pax_core.parallel.processes import join_processes

join_processes()
address = os.environ["PAX_COORDINATOR_ADDRESS"]
port = int(address.rpartition(":")[2])
found = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    with open(table) as f:
        for row in f.read().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            host, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                raw = bytes.fromhex(host)  # 32-bit words in the host's (little-endian) order
                ip = ipaddress.ip_address(b"".join(raw[i:i + 4][::-1]
                                                   for i in range(0, len(raw), 4)))
                found.append(str(getattr(ip, "ipv4_mapped", None) or ip))
print(address, os.environ.get("JAX_COORDINATOR_BIND_ADDRESS"), jax.process_index(),
      sorted(found) if jax.process_index() == 0 else "")
"""


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads Linux's socket tables")
def test_launch_serves_the_coordinator_on_the_loopback_interface_only(tmp_path):
    (tmp_path / "listeners.py").write_text(LISTENERS)
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("PAX_") and k != "JAX_COORDINATOR_BIND_ADDRESS"}
    result = subprocess.run([PAX, "launch", "--processes", "2", "--cpu-devices", "1", "--",
                             sys.executable, str(tmp_path / "listeners.py")],
                            capture_output=True, text=True, timeout=120, env=environ)
    assert result.returncode == 0, result.stderr
    lines = sorted(line for line in result.stdout.splitlines() if line.startswith("[p"))
    assert len(lines) == 2, result.stdout
    address = lines[0].split()[1]
    assert address.startswith("127.0.0.1:")
    assert lines[0] == f"[p0] {address} {address} 0 ['127.0.0.1']"  # and on no other address
    assert lines[1] == f"[p1] {address} {address} 1 "


def test_launch_refuses_an_address_it_cannot_listen_on():
    result = subprocess.run([PAX, "launch", "--processes", "2", "--bind", "192.0.2.1", "--",
                             "true"], capture_output=True, text=True, timeout=60)
    assert _one_line(result) == (
        "pax: error: --bind 192.0.2.1: the coordinator cannot listen there (Cannot assign "
        "requested address); give an address of this machine, such as 127.0.0.1 (the default) "
        "or 0.0.0.0 (every interface)")
