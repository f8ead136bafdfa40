"""pax data prepare asked to stop (SIGTERM from a scheduler, SIGINT from Ctrl-C): its worker
processes end with it, the complete shards are kept, it exits as pax train does (128 + the
signal) with one line, and the same command then finishes the dataset."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pax_core.testing import run_pax
from pax_lm.data.shards import PreparedDataset, shard_name
from pax_lm.preparation import PROGRESS, prepare

PAX = str(Path(sys.executable).with_name("pax"))
DOCUMENTS = 40_000


def _source(folder: Path, documents: int = DOCUMENTS) -> None:
    """``documents`` JSON lines of about 1000 characters: 40 MB by default, seconds of work for
    two workers in shards of half a MB."""
    rng = np.random.default_rng(0)
    block = "".join(rng.choice(np.array(list("abcdefghij klmnopqrstuvwxyz")), 1_000_000))
    folder.mkdir()
    with open(folder / "a.jsonl", "w") as f:
        for i in range(documents):
            start = (i * 997) % (len(block) - 1000)
            f.write(json.dumps({"text": f"doc {i}: {block[start:start + 1000]}"}) + "\n")


def _marks(out: Path) -> list[Path]:
    return sorted((out / PROGRESS).glob("shard-*.json"))


def _running(psutil, process) -> bool:
    """Whether ``process`` still runs (a zombie has ended: only its parent's wait is missing)."""
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill(process: subprocess.Popen, workers: list) -> None:
    """Leave no process behind when a check failed."""
    for worker in workers:
        if worker.is_running():
            worker.kill()
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_request_ends_the_workers_and_keeps_finished_shards(tmp_path, signum):
    psutil = pytest.importorskip("psutil")
    _source(tmp_path / "src")
    out = tmp_path / "out"
    command = ["data", "prepare", str(tmp_path / "src"), "--output", str(out), "--workers", "2",
               "--shard-mb", "0.5"]
    process = subprocess.Popen([PAX, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "PAX_STRICT_PLUGINS": "1"})
    workers = []
    try:
        deadline = time.monotonic() + 60
        while not _marks(out) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _marks(out), "no shard was written"
        workers = psutil.Process(process.pid).children(recursive=True)
        assert len(workers) >= 2, workers
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=30)
        assert process.returncode == 128 + signum, stderr
        name = signal.Signals(signum).name
        assert re.fullmatch(rf"pax: stopped on request \({name}\); the [\d,]+ documents of "
                            rf"complete shards are kept in {re.escape(str(out))}: run the same "
                            rf"command to resume", stderr.strip()), stderr
        _, alive = psutil.wait_procs(workers, timeout=10)
        survivors = [p for p in alive if _running(psutil, p)]
        assert survivors == [], f"worker processes outlived pax data prepare: {survivors}"
    finally:
        _kill(process, workers)

    kept = {mark.name: mark.stat().st_mtime_ns for mark in _marks(out)}
    assert kept and not (out / "metadata.json").exists()
    result = run_pax(*command)
    assert result.returncode == 0, result.stderr
    assert f"prepared {DOCUMENTS:,} documents" in result.stdout
    data = PreparedDataset.open(out)
    assert data.num_documents == DOCUMENTS
    assert len(data.shards) > len(kept)


def _interrupt(record, seconds):
    raise KeyboardInterrupt


@pytest.mark.slow
def test_a_worker_stuck_in_a_write_does_not_hold_up_the_stop(tmp_path):
    """A worker blocked in a write (here: its shard's file is a FIFO no one reads, as a hung
    network file system would block it) is terminated, not waited for."""
    psutil = pytest.importorskip("psutil")
    _source(tmp_path / "src", documents=3000)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):  # claims the output; shard 0 complete
        prepare(tmp_path / "src", out, shard_mb=0.25, workers=0, on_shard=_interrupt)
    stuck = out / (shard_name(1) + ".partial")
    os.mkfifo(stuck)
    command = ["data", "prepare", str(tmp_path / "src"), "--output", str(out), "--workers", "2",
               "--shard-mb", "0.25"]
    process = subprocess.Popen([PAX, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "PAX_STRICT_PLUGINS": "1"})
    workers = []
    try:
        deadline = time.monotonic() + 60
        while len(_marks(out)) < 3 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(_marks(out)) >= 3 and process.poll() is None, "shards were not written"
        workers = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
    finally:
        _kill(process, workers)
    assert process.returncode == 128 + signal.SIGTERM, stderr
    assert stderr.startswith("pax: stopped on request (SIGTERM); ") and stderr.count("\n") == 1
    stuck.unlink()
    result = run_pax(*command)
    assert result.returncode == 0, result.stderr
    assert PreparedDataset.open(out).num_documents == 3000
