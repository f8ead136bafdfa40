"""Damaged checkpoints: detected by their checksums or by failing to restore, named, set aside,
and the run resumes from the one before (or stops, by a setting); never a silent resume from
damaged numbers, never a traceback from inside Orbax."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pax_core.testing import read_metrics, run_pax

pytestmark = pytest.mark.slow

STEPS = ["--set", "task.train.save_interval_steps=10", "--set", "task.train.save_max_to_keep=3"]


def _train(job: Path, steps: int, *extra: str):
    return run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(job), "--set",
                   f"NUM_TRAIN_STEPS={steps}", *STEPS, *extra)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A job trained to step 30 with checkpoints at 10, 20 and 30, trained once per module."""
    job = tmp_path_factory.mktemp("trained") / "job"
    first = _train(job, 30)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["10", "20", "30"]
    return job


@pytest.fixture
def job(trained, tmp_path) -> Path:
    """A copy of the trained job, the test's own to damage."""
    job = tmp_path / "job"
    shutil.copytree(trained, job)
    return job


def _array_files(step: Path) -> list[Path]:
    return sorted(p for p in (step / "state").rglob("*") if p.is_file() and p.parent.name == "d")


def _flip_bytes(path: Path, count: int = 8) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    for i in range(middle, middle + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _assert_resumed_from(result, step: int, damaged: int) -> None:
    assert result.returncode == 0, result.stderr
    assert f"checkpoint step {damaged} is damaged" in result.stderr
    assert f"resuming from step {step} of" in result.stdout


def test_every_committed_step_has_a_checksum_record(job):
    for step in ("10", "20", "30"):
        record = json.loads((job / "checkpoints" / step / "pax_checksums.json").read_text())
        assert any(name.startswith("state/") for name in record)


def test_flipped_bytes_in_the_newest_step_fall_back_to_the_one_before(job):
    for path in _array_files(job / "checkpoints" / "30"):
        _flip_bytes(path)
    result = _train(job, 40)
    _assert_resumed_from(result, 20, damaged=30)
    assert "does not match its checksum" in result.stderr
    moved = list((job / "damaged_checkpoints").iterdir())
    assert [p.name.split("-")[0] for p in moved] == ["30"]
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["20", "30", "40"]
    losses = [r["loss"] for r in read_metrics(job) if r.get("kind") == "train"]
    assert all(loss == loss for loss in losses)  # no NaN from damaged numbers


def test_a_truncated_file_is_named(job):
    victim = _array_files(job / "checkpoints" / "30")[0]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    result = _train(job, 40)
    _assert_resumed_from(result, 20, damaged=30)
    assert f"{victim.relative_to(job / 'checkpoints' / '30')} has" in result.stderr


def test_a_missing_state_folder_falls_back(job):
    shutil.rmtree(job / "checkpoints" / "30" / "state")
    _assert_resumed_from(_train(job, 40), 20, damaged=30)


def _drop_records(job: Path) -> None:
    """A job whose steps have no checksum records (written before records existed)."""
    for record in (job / "checkpoints").glob("*/pax_checksums.json"):
        record.unlink()


def test_a_step_without_its_record_is_not_trusted_when_an_earlier_one_has_one(job):
    """A kill between a step's commit and its record leaves it unverifiable: with an earlier
    step that can be verified, it counts as damaged. Here its bytes were changed too, in a way
    no format check sees (another input position), which it would otherwise resume from."""
    step = job / "checkpoints" / "30"
    (step / "pax_checksums.json").unlink()
    (step / "input" / "metadata").write_text('{"index": 7}')
    result = _train(job, 40)
    assert result.returncode == 0, result.stderr
    assert "checkpoint step 30 cannot be verified (it has no checksum record" in result.stderr
    assert "resuming from step 20 of" in result.stdout


def test_a_step_without_a_record_that_does_not_restore_falls_back(job):
    _drop_records(job)
    step = job / "checkpoints" / "30"
    shutil.rmtree(step / "state")
    result = _train(job, 40)
    _assert_resumed_from(result, 20, damaged=30)
    assert "does not" in result.stderr.split("checkpoint step 30 is damaged")[1].splitlines()[0]


@pytest.mark.parametrize("checksummed", [True, False])
def test_an_input_position_that_does_not_fit_falls_back(job, checksummed):
    step = job / "checkpoints" / "30"
    if not checksummed:
        _drop_records(job)
    (step / "input" / "metadata").write_text('{"position": "nowhere"}')
    result = _train(job, 40)
    _assert_resumed_from(result, 20, damaged=30)
    named = "input/metadata has" if checksummed else "saved input position does not fit"
    assert named in result.stderr


def test_an_input_that_refuses_its_position_for_a_reason_stops_with_it():
    """An input's own UsageError (a position saved by another process count, say) is the
    user's to act on: the run stops with it, and no checkpoint is marked damaged."""
    from pax_core import SyntheticInput, UsageError
    from pax_core.run.build import _set_input_position

    class Refusing(SyntheticInput):
        def set_state(self, state):
            raise UsageError("saved by 2 processes, this run has 1")

    with pytest.raises(UsageError, match="saved by 2 processes"):
        _set_input_position(Refusing(), {"index": 3})


def test_an_empty_newer_step_folder_falls_back(job):
    (job / "checkpoints" / "35").mkdir()
    _assert_resumed_from(_train(job, 40), 30, damaged=35)


def test_stop_on_a_damaged_checkpoint_changes_nothing(job):
    for path in _array_files(job / "checkpoints" / "30"):
        _flip_bytes(path)
    runs = (job / "runs.jsonl").read_text()
    result = _train(job, 40, "--set", "task.train.on_damaged_checkpoint='stop'")
    assert result.returncode == 2
    assert "checkpoint step 30 in" in result.stderr and "is damaged" in result.stderr
    assert result.stderr.count("\n") == 1
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["10", "20", "30"]
    assert (job / "runs.jsonl").read_text() == runs
    assert not (job / "damaged_checkpoints").exists()


def test_every_checkpoint_damaged_stops_in_one_line_and_again_moving_nothing(job):
    for step in ("10", "20", "30"):
        for path in _array_files(job / "checkpoints" / step):
            _flip_bytes(path)
    runs = (job / "runs.jsonl").read_text()
    for _ in range(2):  # the same command again does not start over from step 0
        result = _train(job, 40)
        assert result.returncode == 1, result.stderr
        assert result.stderr.count("\n") == 1, result.stderr
        assert "every checkpoint in" in result.stderr
        assert all(f"step {s}: " in result.stderr for s in (10, 20, 30))
        assert "train again from step 0" in result.stderr
        assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["10", "20", "30"]
        assert not (job / "damaged_checkpoints").exists()
        assert (job / "runs.jsonl").read_text() == runs


def test_an_unfinished_save_is_removed_with_one_clear_line(job):
    leftover = job / "checkpoints" / "40.orbax-checkpoint-tmp-1234"
    leftover.mkdir()
    (leftover / "partial").write_text("x")
    result = _train(job, 40)
    assert result.returncode == 0, result.stderr
    assert "removed the unfinished save of step 40" in result.stderr
    assert "Removing existing directory" not in result.stderr
    assert not leftover.exists()


def test_eval_of_a_job_with_only_an_unfinished_save_is_refused(tmp_path):
    job = tmp_path / "job"
    (job / "checkpoints" / "10.orbax-checkpoint-tmp-1").mkdir(parents=True)
    (job / "runs.jsonl").write_text(json.dumps({"experiment": "core/MlpSynthetic",
                                                "overrides": []}) + "\n")
    result = run_pax("eval", "--job-dir", str(job))
    assert result.returncode == 2
    assert "no complete checkpoint" in result.stderr
