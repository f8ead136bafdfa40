"""``pax launch --tpu``: Cloud TPU slices from one command, against a stand-in ``gcloud``.

The stand-in (``STAND_IN``, put first on PATH) records every call and does what Google's CLI
does on the machines a call names: a queued resource becomes active, a TPU describes its
workers (all at 127.0.0.1), and ``tpu-vm ssh --worker=W --command C`` runs ``C`` here, as that
worker would. So a 2-slice x 2-worker launch really starts 4 ``pax train`` processes that form
2 slices (pax-multislice groups consecutive processes into a slice) and train, and the run is
compared with one process training the same experiment on the same 8 devices.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pax_core.testing import cpu_xla_flags, read_metrics, run_pax

PAX = str(Path(sys.executable).with_name("pax"))
STAND_IN = textwrap.dedent(f"""\
    #!{sys.executable}
    import json, os, shlex, subprocess, sys
    args = sys.argv[1:]
    with open(os.environ["GCLOUD_CALLS"], "a") as log:
        log.write(json.dumps(args) + "\\n")
    assert args[:2] == ["compute", "tpus"], args
    what, verb, name = args[2], args[3], args[4]
    workers = int(os.environ.get("GCLOUD_WORKERS", "2"))
    if what == "queued-resources" and verb == "describe":
        print("ACTIVE")
    elif what == "tpu-vm" and verb == "describe":
        print(json.dumps({{"state": "READY", "acceleratorType": "v4-16",
                           "networkEndpoints": [{{"ipAddress": "127.0.0.1"}}] * workers}}))
    elif what == "tpu-vm" and verb == "ssh":
        worker = next(a for a in args if a.startswith("--worker=")).split("=")[1]
        command = args[args.index("--command") + 1]
        if command == "pax --version" and os.environ.get("GCLOUD_PAX_VERSION"):
            command = "echo " + shlex.quote(os.environ["GCLOUD_PAX_VERSION"])
        if worker != "all":
            os.execvp("bash", ["bash", "-c", command])
        for w in range(workers):
            subprocess.run(["bash", "-c", command], check=True)
""")
SMALL = ["VOCAB_SIZE=256", "MAX_SEQ_LEN=32", "NUM_LAYERS=2", "MODEL_DIMS=64", "HIDDEN_DIMS=128",
         "NUM_HEADS=2", "DIMS_PER_HEAD=32", "PERCORE_BATCH_SIZE=2", "FPROP_DTYPE='float32'",
         "SUMMARY_INTERVAL_STEPS=1", "ICI_MESH_SHAPE=[1,4,1]"]
EXP = ["--plugin", "lm", "--exp", "LmCloudSpmdMultislice2B"]


@pytest.fixture
def gcloud(tmp_path, monkeypatch) -> Path:
    """The stand-in on PATH, its calls logged to the returned file; each process it starts
    gets 2 CPU devices (a worker of 2 chips)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "gcloud").write_text(STAND_IN)
    (folder / "gcloud").chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    here = Path(sys.executable).parent  # the "workers" run this installation's pax
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{here}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("GCLOUD_CALLS", str(calls))
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setenv("XLA_FLAGS", cpu_xla_flags(2))
    monkeypatch.setenv("PAX_STRICT_PLUGINS", "1")
    for name in list(os.environ):
        if name.startswith(("PAX_COORDINATOR", "PAX_NUM_PROCESSES", "PAX_PROCESS_ID",
                            "MEGASCALE_")):
            monkeypatch.delenv(name)
    return calls


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _sets(*items: str) -> list[str]:
    return [a for item in items for a in ("--set", item)]


def _launch(*args: str, timeout: float = 420) -> subprocess.CompletedProcess:
    return subprocess.run([PAX, "launch", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_two_slices_of_two_workers_train_as_one_process(gcloud, tmp_path, monkeypatch):
    steps = ["NUM_TRAIN_STEPS=4", "EVAL_INTERVAL_STEPS=4", "CHECKPOINT_EVERY_N_STEPS=4"]
    job = tmp_path / "two"
    args = ["--tpu", "pax-v4", "--zone", "us-central2-b", "--slices", "2", "--create", "v4-16",
            "--runtime", "tpu-ubuntu2204-base", "--"]
    command = ["pax", "train", *EXP, "--job-dir", str(job), *_sets(*SMALL, *steps)]
    launched = _launch(*args, *command)
    assert launched.returncode == 0, launched.stderr[-3000:]
    monkeypatch.setenv("XLA_FLAGS", cpu_xla_flags(8))
    alone = run_pax("train", *EXP, "--job-dir", str(tmp_path / "one"), *_sets(*SMALL, *steps),
                    timeout=300)
    assert alone.returncode == 0, alone.stderr[-3000:]
    runs = [[r for r in read_metrics(j) if r["kind"] == "train"] for j in (tmp_path / "one", job)]
    assert [r["step"] for r in runs[0]] == [r["step"] for r in runs[1]] and runs[0]
    for a, b in zip(*runs, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-6)
    start = next(r for r in read_metrics(job) if r["kind"] == "start")
    assert "multislice.megascale: MEGASCALE_SLICE_ID=0" in start["presets"]
    # what ran is what a dry run prints (the guide shows the recipe's), but for the wait for
    # the queued resource and the addresses a dry run cannot know
    dry = _launch(*args[:-1], "--dry-run", "--", *command, timeout=60)
    assert dry.returncode == 0, dry.stderr
    calls = _calls(gcloud)
    ran = [shlex.join(["gcloud", *c]) for c in calls if c[2:4] != ["queued-resources",
                                                                   "describe"]]
    printed = [re.sub(r"pax-v4-0\.worker-0", "127.0.0.1", line)
               for line in dry.stdout.splitlines()]
    ids = re.compile(r"pax-launch-\w{8}-")
    assert sorted(ids.sub("ID-", line) for line in ran) == sorted(
        ids.sub("ID-", line) for line in printed)
    where = ["--zone", "us-central2-b"]
    assert calls[0] == ["compute", "tpus", "queued-resources", "create", "pax-v4",
                        "--accelerator-type", "v4-16", "--runtime-version",
                        "tpu-ubuntu2204-base", "--node-count", "2", "--node-prefix", "pax-v4",
                        *where]
    assert calls[1][2:5] == ["queued-resources", "describe", "pax-v4"]
    assert [c[2:5] for c in calls[2:4]] == [["tpu-vm", "describe", "pax-v4-0"],
                                            ["tpu-vm", "describe", "pax-v4-1"]]
    ssh = [c for c in calls if c[3] == "ssh"]
    assert [(c[4], c[5], c[7]) for c in ssh[:2]] == [
        ("pax-v4-0", "--worker=all", "pax --version"),
        ("pax-v4-1", "--worker=all", "pax --version")]
    runs_ = {(c[4], c[5]): c[7] for c in ssh[2:6]}
    assert sorted(runs_) == [("pax-v4-0", "--worker=0"), ("pax-v4-0", "--worker=1"),
                             ("pax-v4-1", "--worker=0"), ("pax-v4-1", "--worker=1")]
    for (name, worker), remote in runs_.items():
        index = int(name[-1]) * 2 + int(worker[-1])
        assert (f"PAX_COORDINATOR_ADDRESS=127.0.0.1:8476 PAX_NUM_PROCESSES=4 "
                f"PAX_PROCESS_ID={index} pax train") in remote
    # each slice's worker 0 shown, prefixed (pax logs on process 0); the others' kept back
    assert "[s0w0] lm/LmCloudSpmdMultislice2B: trained to step 4 of 4" in launched.stdout
    assert "[s0w1] " not in launched.stdout + launched.stderr
    assert "[s1w1] " not in launched.stdout + launched.stderr


def _pid(folder: Path, pattern: str, timeout: float = 240) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = sorted(folder.glob(pattern))
        if found and found[0].read_text().strip():
            return int(found[0].read_text())
        time.sleep(0.2)
    raise AssertionError(f"no {pattern}")


@pytest.mark.slow
def test_a_worker_killed_stops_every_worker_with_a_message(gcloud, tmp_path):
    job = tmp_path / "job"
    launcher = subprocess.Popen(
        [PAX, "launch", "--tpu", "pax-v4", "--zone", "us-central2-b", "--slices", "2", "--",
         "pax", "train", *EXP, "--job-dir", str(job),
         *_sets(*SMALL, "NUM_TRAIN_STEPS=100000", "CHECKPOINT_EVERY_N_STEPS=100000")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        victim = _pid(tmp_path, "pax-launch-*-s1w1.pid")
        workers = [_pid(tmp_path, f"pax-launch-*-s{s}w{w}.pid") for s in (0, 1) for w in (0, 1)]
        deadline, metrics = time.monotonic() + 240, job / "metrics.jsonl"
        while time.monotonic() < deadline and launcher.poll() is None and not (
                metrics.exists() and any(r["kind"] == "train" for r in read_metrics(job))):
            time.sleep(0.5)  # training: every worker has joined
        assert launcher.poll() is None, launcher.communicate()[1][-3000:]
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert time.monotonic() - killed < 60
    assert launcher.returncode == 128 + signal.SIGKILL
    assert "pax launch: slice 1 worker 1 was killed by signal 9; stopping the others" in err
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(
            f"/proc/{pid}/status").read_text().lower(), pid


def test_a_dry_run_prints_the_commands_the_guide_shows(gcloud):
    """The guide's Cloud TPU recipe, Pax's 2 x v4-128 multi-slice run, is this dry run's
    output (the launch's random id aside)."""
    guide = Path(__file__).parents[1] / "docs" / "clusters.md"
    block = re.search(r"<!-- dry-run: (.*?) -->\n```bash\n(.*?)```", guide.read_text(),
                      re.DOTALL)
    args = block.group(1).split()
    out = _launch(*args[2:], timeout=60)  # "pax launch ..."
    assert out.returncode == 0, out.stderr
    printed = re.sub(r"pax-launch-\w{8}-", "pax-launch-ID-", out.stdout)
    assert printed == block.group(2)
    assert not gcloud.exists()  # a dry run with --create calls nothing


def test_a_worker_with_another_pax_is_refused(gcloud, monkeypatch):
    monkeypatch.setenv("GCLOUD_PAX_VERSION", "pax 0.1 (plugin API 1.0)")
    out = _launch("--tpu", "pax-v4", "--zone", "us-central2-b", "--slices", "2", "--", "pax",
                  "train", *EXP, timeout=60)
    assert out.returncode == 2
    assert "its workers run 'pax 0.1 (plugin API 1.0)'" in out.stderr and "--install" in out.stderr


@pytest.mark.parametrize("args, words", [
    (["--tpu", "t", "--", "pax", "train"], "--tpu needs --zone"),
    (["--tpu", "t", "--zone", "z", "--create", "v4-128", "--", "pax"], "go together"),
    (["--tpu", "t", "--zone", "z", "--create", "v4-100", "--runtime", "r", "--", "pax"],
     "--create 'v4-100': no published v4 slice has 100 cores"),
    (["--tpu", "t", "--zone", "z", "--create", "h100-8", "--runtime", "r", "--", "pax"],
     "not a TPU accelerator type"),
    (["--tpu", "t", "--zone", "z"], "needs the command to run after --"),
    (["--tpu", "t", "--zone", "z", "--partition", "p", "--", "pax"], "--partition goes with"),
    (["--processes", "2", "--tpu", "t", "--", "pax"], "give one of --processes, --tpu"),
    (["--tpu", "t", "--zone", "z", "--slices", "4", "--", "pax", "train", "--plugin", "lm",
      "--exp", "C4Spmd22BAdam2xv4_128"],
     "C4Spmd22BAdam2xv4_128's DCN_MESH_SHAPE [2, 1, 1] spans 2 slice(s) and pax launch starts 4"),
    (["--k8s", "--image", "i", "--accelerator", "tpu-v4-podslice", "--topology", "4x4x4", "--",
      "pax", "train", "-p", "lm", "-e", "C4Spmd22BAdam2xv4_128"], "spans 2 slice(s)"),
])
def test_bad_tpu_launches_are_one_line_and_exit_2(args, words):
    from typer.testing import CliRunner

    from pax_core.cli.app import build_app
    from pax_core.errors import UsageError
    from pax_core.plugins.host import PluginHost

    host = PluginHost()  # the installed plugins: pax-lm's experiments among them
    result = CliRunner().invoke(build_app(host), ["launch", *args], obj=host)
    assert isinstance(result.exception, UsageError), (result.output, result.exception)
    assert words in str(result.exception) and result.exception.exit_code == 2


def test_gcloud_missing_names_how_to_install_it(tmp_path):
    out = subprocess.run([PAX, "launch", "--tpu", "t", "--zone", "z", "--", "pax", "train"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PATH": str(Path(sys.executable).parent)})
    assert out.returncode == 2
    assert out.stderr.strip() == ("pax: error: pax launch --tpu drives Google's gcloud, which is "
                                  "not on PATH; install the Google Cloud CLI "
                                  "(https://cloud.google.com/sdk/docs/install) and run gcloud "
                                  "auth login")
