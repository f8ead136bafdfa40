"""`pax launch --slurm`: the batch script it writes, what it refuses, and jobs on a real
one-node SLURM cluster (Debian's slurm-wlm and munge) that this file starts under a temporary
folder: two tasks training as one run, a failing job, a stopped launcher."""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pax_core.errors import UsageError
from pax_core.launchers.slurm import SlurmOptions, launch, script
from pax_core.testing import cpu_xla_flags, read_metrics

PAX = str(Path(sys.executable).with_name("pax"))
TRAIN = ["pax", "train", "--exp", "TinyCounting", "--set", "NUM_TRAIN_STEPS=20"]
PACKAGES = "apt-get install -y slurm-wlm munge"
# Daemons live in sbin, which an ordinary user's PATH may lack.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
# A job still running after this long is cancelled, so that a hung job fails its test.
JOB_LIMIT_S = 180


def _sbatch_lines(text: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in text.splitlines()
            if line.startswith("#SBATCH ")]


def test_script_runs_one_task_per_gpu_by_default():
    text = script(["pax", "train", "--exp", "X"], SlurmOptions("gpu", nodes=2, gpus_per_node=8),
                  "/shared/job.out")
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash"
    assert _sbatch_lines(text) == ["--job-name=pax", "--nodes=2", "--ntasks-per-node=8",
                                   "--gpus-per-node=8", "--partition=gpu",
                                   "--output=/shared/job.out"]
    # The job runs this installation's pax.
    assert lines[-1] == f"srun --kill-on-bad-exit=1 --label {shlex.quote(PAX)} train --exp X"
    assert "#   pax train --exp X" in lines


def test_script_takes_explicit_tasks_and_extra_arguments():
    options = SlurmOptions("cpu", tasks_per_node=4, time="1:00:00", account="proj",
                           sbatch_args=("--qos=high", "--exclusive"), job_name="lm")
    assert _sbatch_lines(script(["run"], options, "out")) == [
        "--job-name=lm", "--nodes=1", "--ntasks-per-node=4", "--partition=cpu",
        "--time=1:00:00", "--account=proj", "--qos=high", "--exclusive", "--output=out"]
    assert "--ntasks-per-node=1" in _sbatch_lines(script(["run"], SlurmOptions("cpu"), "out"))


def test_script_quotes_the_command():
    command = ["sh", "-c", "echo 'a b' \"$HOME\"\necho done", "two words"]
    text = script(command, SlurmOptions("debug"), "out")
    before, srun = text.split("\nsrun ")
    # The newline stays inside the quoted command: every line before it is a comment or set-up.
    assert all(line.startswith("#") for line in before.splitlines()
               if line != "export PYTHONUNBUFFERED=1")
    assert shlex.split("srun " + srun) == ["srun", "--kill-on-bad-exit=1", "--label", *command]


@pytest.mark.parametrize(("command", "options", "message"), [
    (["pax"], SlurmOptions(None), "--slurm needs --partition P (sinfo lists them)"),
    (["pax"], SlurmOptions("debug", nodes=0), "--nodes must be an integer >= 1, got '0'"),
    (["pax"], SlurmOptions("debug", tasks_per_node=0),
     "--tasks-per-node must be an integer >= 1, got '0'"),
    ([], SlurmOptions("debug"), "pax launch needs the command to run after --, such as: "
     "pax launch --slurm --partition P -- pax train --exp ... --job-dir ..."),
    (["pax"], SlurmOptions("debug", time="1 day"),
     "--time must be one word without spaces, got '1 day'"),
    (["pax"], SlurmOptions("debug", sbatch_args=("qos=high",)),
     "each extra sbatch argument must be one option such as --qos=high, got 'qos=high'"),
])
def test_mistakes_are_refused_before_anything_is_written(command, options, message, tmp_path,
                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as refused:
        launch(command, options)
    assert str(refused.value) == message
    assert list(tmp_path.iterdir()) == []


def test_a_machine_without_sbatch_is_told_what_to_install(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(UsageError) as refused:
        launch(["pax"], SlurmOptions("debug"), dry_run=True)
    assert str(refused.value) == ("pax launch --slurm needs SLURM's sbatch on PATH "
                                  "(on Debian: apt install slurm-client)")


def test_a_dry_run_prints_the_script_and_submits_nothing(monkeypatch, tmp_path, capsys):
    if shutil.which("sbatch") is None:
        pytest.skip(f"no sbatch: {PACKAGES}")
    monkeypatch.chdir(tmp_path)
    options = SlurmOptions("debug", gpus_per_node=4)
    assert launch(["pax", "train"], options, dry_run=True) == 0
    assert capsys.readouterr().out == script(["pax", "train"], options,
                                             "pax-launch-<time>/job.out")
    assert list(tmp_path.iterdir()) == []


# A real cluster: munged, slurmctld and slurmd of this machine, everything under a temporary
# folder, ports chosen free, so that it runs beside another cluster or another test run.

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _slurm_conf(root: Path, host: str) -> str:
    # JAX derives its coordinator port from the job id: a random first id keeps the jobs of
    # two such clusters on one machine off each other's ports.
    first_job = int.from_bytes(os.urandom(3), "big") % 1_000_000 + 1000
    return f"""\
ClusterName=paxtest
SlurmctldHost={host}
SlurmUser={getpass.getuser()}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
FirstJobId={first_job}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
AuthType=auth/munge
AuthInfo=socket={root}/munge.socket
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
NodeName={host} CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _wait_for(check, seconds: float, what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {p.name}\n{p.read_text()[-2000:]}" for p in logs if p.exists())
            pytest.fail(f"{what} did not happen in {seconds} s\n{tails}")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory) -> Iterator[Path]:
    """A one-node cluster with a partition ``debug`` of 2 CPUs; yields its slurm.conf."""
    programs = {name: shutil.which(name, path=SEARCH_PATH)
                for name in ("munged", "slurmctld", "slurmd", "sbatch", "sinfo")}
    missing = [name for name, path in programs.items() if path is None]
    if missing:
        pytest.skip(f"no {', '.join(missing)}: a SLURM cluster needs {PACKAGES}")
    root = tmp_path_factory.mktemp("slurm")
    for folder in ("state", "spool"):
        (root / folder).mkdir()
    key = root / "munge.key"
    key.touch(mode=0o600)
    key.write_bytes(os.urandom(1024))
    conf = root / "slurm.conf"
    conf.write_text(_slurm_conf(root, socket.gethostname().split(".")[0]))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    # --force: munged refuses a socket in a folder that others cannot enter, as pytest's are.
    commands = [[programs["munged"], "--foreground", "--force", f"--socket={root}/munge.socket",
                 f"--key-file={key}", f"--pid-file={root}/munged.pid",
                 f"--log-file={root}/munged.log", f"--seed-file={root}/munged.seed"],
                [programs["slurmctld"], "-D", "-f", str(conf)],
                [programs["slurmd"], "-D", "-f", str(conf)]]
    logs = [root / f"{Path(c[0]).name}.out" for c in commands]
    logs += [root / "munged.log", root / "slurmctld.log", root / "slurmd.log"]
    daemons: list[subprocess.Popen] = []
    try:
        for command, log in zip(commands, logs, strict=False):
            with log.open("wb") as out:
                daemons.append(subprocess.Popen(command, env=env, stdout=out,
                                                stderr=subprocess.STDOUT, start_new_session=True))
            if command[0] == programs["munged"]:
                _wait_for((root / "munge.socket").exists, 10, "munged's start", logs)

        def idle() -> bool:
            shown = subprocess.run([programs["sinfo"], "-h", "-N", "-o", "%t"], env=env,
                                   capture_output=True, text=True)
            return shown.stdout.strip() == "idle"

        _wait_for(idle, 60, "the node's registration (sinfo: idle)", logs)
        yield conf
    finally:
        for daemon in reversed(daemons):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(daemon.pid, signal.SIGTERM)
            try:
                daemon.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.pid, signal.SIGKILL)
                daemon.wait()


@pytest.fixture
def slurm(slurm_cluster, monkeypatch, tmp_path) -> Iterator[None]:
    """The cluster for this test's SLURM commands; a job left running at ``JOB_LIMIT_S`` is
    cancelled, which ends the launcher that follows it."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster))
    monkeypatch.setenv("PAX_STRICT_PLUGINS", "1")
    monkeypatch.chdir(tmp_path)
    watchdog = threading.Timer(JOB_LIMIT_S, subprocess.run,
                               [["scancel", "--partition=debug"]])
    watchdog.start()
    yield
    watchdog.cancel()


def _job_id(err: str) -> str:
    [job] = re.findall(r"^pax launch: submitted SLURM job (\d+);", err, re.MULTILINE)
    return job


@pytest.mark.slow
def test_two_tasks_of_a_job_train_as_one_process_with_as_many_devices(slurm, monkeypatch,
                                                                        tmp_path, capsys):
    # srun passes the launcher's environment on: each task sees 4 CPU devices.
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("XLA_FLAGS", cpu_xla_flags(4))
    code = launch([*TRAIN, "--job-dir", str(tmp_path / "two")],
                  SlurmOptions("debug", tasks_per_node=2))
    out, err = capsys.readouterr()
    assert code == 0, out + err
    job = _job_id(err)
    assert err.splitlines()[-1] == f"pax launch: SLURM job {job} ended COMPLETED"
    assert f"[slurm {job}] 0: testplugin/TinyCounting: trained to step 20 of 20" in out
    assert all(line.startswith(f"[slurm {job}] ") for line in out.splitlines())
    assert "Gloo" not in out
    [folder] = tmp_path.glob("pax-launch-*")
    assert (folder / "job.sbatch").read_text().splitlines()[-1].endswith(
        f"--label {shlex.quote(PAX)} {shlex.join(TRAIN[1:])} --job-dir {tmp_path / 'two'}")

    single = subprocess.run(
        [PAX, *TRAIN[1:], "--job-dir", str(tmp_path / "one")], capture_output=True, text=True,
        timeout=120, env={**os.environ, "XLA_FLAGS": cpu_xla_flags(8)})
    assert single.returncode == 0, single.stderr
    two, one = read_metrics(tmp_path / "two"), read_metrics(tmp_path / "one")
    # Each task had 4 devices of the run's 8: the two tasks joined as one run.
    assert two[0]["num_devices"] == one[0]["num_devices"] == 8
    assert "host shared by 4 device(s)" in two[0]["peak_source"]
    assert [(r["step"], r["kind"]) for r in two] == [(r["step"], r["kind"]) for r in one] == [
        (0, "start"), (10, "train"), (20, "train"), (20, "eval/test")]
    for a, b in zip(two[1:], one[1:], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


@pytest.mark.slow
def test_a_failing_job_shows_why_and_returns_its_exit_code(slurm, tmp_path, capsys):
    code = launch(["pax", "train", "--exp", "NoSuchExperiment", "--job-dir",
                   str(tmp_path / "job")], SlurmOptions("debug", tasks_per_node=2))
    out, err = capsys.readouterr()
    job = _job_id(err)
    assert code == 2, out + err
    errors = [line for line in out.splitlines() if "pax: error: " in line]
    assert errors and all(re.fullmatch(
        rf"\[slurm {job}\] [01]: pax: error: unknown experiment 'NoSuchExperiment'.*", line)
        for line in errors), out
    assert err.splitlines()[-1] == f"pax launch: SLURM job {job} ended FAILED (exit code 2)"


@pytest.mark.slow
def test_a_stopped_launcher_cancels_its_job(slurm, tmp_path):
    follow = ("import sys; from pax_core.launchers.slurm import SlurmOptions, launch; "
              "sys.exit(launch(['sh', '-c', 'echo started; exec sleep 600'], "
              "SlurmOptions('debug')))")
    launcher = subprocess.Popen([sys.executable, "-c", follow], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    first = launcher.stdout.readline()
    assert re.fullmatch(r"\[slurm \d+\] 0: started\n", first), first
    launcher.send_signal(signal.SIGTERM)
    out, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 143, out + err
    job = _job_id(err)
    assert err.splitlines()[-1] == f"pax launch: stopped by SIGTERM: cancelled SLURM job {job}"
    deadline = time.monotonic() + 30
    while "JobState=CANCELLED" not in (shown := subprocess.run(
            ["scontrol", "-o", "show", "job", job], capture_output=True, text=True).stdout):
        assert time.monotonic() < deadline, shown
        time.sleep(0.5)
