"""Which checkpoints a run keeps: the newest few, plus one every K steps or every interval of
time (Pax's save_keep_interval_duration)."""

from __future__ import annotations

import pytest

from pax_core.errors import UsageError
from pax_core.testing import isolated_host, run_pax, train

pytestmark = pytest.mark.slow

EVERY_STEP = ["--set", "NUM_TRAIN_STEPS=12", "--set", "task.train.save_interval_steps=1",
              "--set", "task.train.save_max_to_keep=2"]


def _train(tmp_path, *extra: str) -> list[int]:
    job = tmp_path / "job"
    result = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(job), *EVERY_STEP, *extra)
    assert result.returncode == 0, result.stderr
    return sorted(int(p.name) for p in (job / "checkpoints").iterdir() if p.name.isdigit())


def test_the_newest_are_kept_and_no_more(tmp_path):
    assert _train(tmp_path) == [11, 12]


def test_one_every_k_steps_is_kept_besides_the_newest(tmp_path):
    assert _train(tmp_path, "--set", "task.train.save_keep_interval_steps=4") == [4, 8, 11, 12]


def test_one_every_interval_of_time_is_kept_besides_the_newest(tmp_path):
    # Within a day of the first step nothing else is due: the first stays, with the newest.
    assert _train(tmp_path, "--set", "task.train.save_keep_interval_duration='1d'") == [1, 11, 12]


def test_a_duration_that_does_not_read_is_refused(tmp_path):
    """Through the ``pax`` command; every kind of bad duration is the next test's."""
    result = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(tmp_path / "job"),
                     "--set", "task.train.save_keep_interval_duration='12x'")
    assert result.returncode == 2
    assert "save_keep_interval_duration must be" in result.stderr
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize("value", ["'12x'", "'h'", "'-1h'"])
def test_each_duration_that_does_not_read_is_refused(tmp_path, capfd, value):
    """``pax train`` in this process: the usage error (exit 2) that the command prints as its
    one line, and nothing else said (the test above)."""
    with pytest.raises(UsageError) as refused:
        train(isolated_host(), exp="MlpSynthetic", plugin=None, job_dir=str(tmp_path / "job"),
              set_items=[f"task.train.save_keep_interval_duration={value}"])
    assert "save_keep_interval_duration must be" in str(refused.value)
    assert "\n" not in str(refused.value) and refused.value.exit_code == 2
    assert capfd.readouterr().err == ""
    assert not (tmp_path / "job").exists()
