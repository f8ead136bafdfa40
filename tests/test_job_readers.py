"""The commands that read a job (``pax eval``, ``pax export``; a modality's ``pax decode`` uses
the same path) never touch its files: they may run while ``pax train`` is still writing it, and
a reader that tidied up the save in progress would kill the run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pax_core.testing import run_pax

pytestmark = pytest.mark.slow


def _listing(job: Path) -> dict[str, int]:
    """Every file under the job with its size: what a reader must leave as it was."""
    return {str(p.relative_to(job)): p.stat().st_size for p in job.rglob("*") if p.is_file()}


def test_eval_and_export_of_a_job_in_training_leave_the_run_alone(tmp_path):
    job, pax = tmp_path / "job", Path(sys.executable).with_name("pax")
    # A save every step: a save is in progress (an unfinished folder) nearly all the time.
    train = subprocess.Popen(
        [str(pax), "train", "--exp", "MlpSynthetic", "--job-dir", str(job), "--set",
         "NUM_TRAIN_STEPS=1000000", "--set", "task.train.save_interval_steps=1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not any(p.name.isdigit() for p in (job / "checkpoints").glob("*")):
            assert train.poll() is None and time.monotonic() < deadline, train.communicate()
            time.sleep(0.2)
        evaluated = run_pax("eval", "--job-dir", str(job), "--json", timeout=240)
        exported = run_pax("export", "--job-dir", str(job), "--output",
                           str(tmp_path / "exported"), timeout=240)
        assert train.poll() is None, train.communicate()  # the readers ran while it trained
    finally:
        train.send_signal(signal.SIGTERM)
        out, err = train.communicate(timeout=240)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "test" in json.loads(evaluated.stdout)["eval"]
    assert exported.returncode == 0, exported.stderr
    assert train.returncode == 128 + signal.SIGTERM, err
    assert "stopped on request (SIGTERM)" in err


def test_a_reader_passes_over_a_damaged_step_and_an_unfinished_save_moving_nothing(tmp_path):
    job = tmp_path / "job"
    trained = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(job), "--set",
                      "NUM_TRAIN_STEPS=20", "--set", "task.train.save_interval_steps=10")
    assert trained.returncode == 0, trained.stderr
    unfinished = job / "checkpoints" / "30.orbax-checkpoint-tmp-1"
    unfinished.mkdir()
    (unfinished / "partial").write_text("being written")
    (job / "checkpoints" / "20" / "input" / "metadata").write_text('{"index": 3}')
    before = _listing(job)
    result = run_pax("eval", "--job-dir", str(job), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["step"] == 10
    assert "checkpoint step 20 is damaged" in result.stderr and "left in place" in result.stderr
    assert _listing(job) == before
