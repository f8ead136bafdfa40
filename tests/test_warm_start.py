"""Warm starts (``pax train --init-from``, Pax's ``init_from_checkpoint_rules``): a new job's
weights come from another job (or an export), mapped by rules, on this job's devices; a
resumed job never reads the source again; what cannot be mapped stops the run in one line
before anything is written."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from pax_core.errors import UsageError
from pax_core.testing import isolated_host, read_params, run_pax, train

pytestmark = pytest.mark.slow

# A learning rate too small to move any weight by more than 1e-20 in the one step the jobs
# below train: their checkpoints hold the weights they started from (a rate of 0 is refused).
FROZEN = ("--set", "task.train.learner.optimizer.learning_rate=1e-30")
ATOL = 1e-20


def _train(job: Path, steps: int, *extra: str):
    return run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(job), "--set",
                   f"NUM_TRAIN_STEPS={steps}", *extra)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """A job trained 20 steps: weights far from any fresh start."""
    job = tmp_path_factory.mktemp("source") / "job"
    result = _train(job, 20)
    assert result.returncode == 0, result.stderr
    return job


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> dict[str, np.ndarray]:
    """The weights a new job starts from without a warm start."""
    job = tmp_path_factory.mktemp("fresh") / "job"
    result = _train(job, 1, *FROZEN)
    assert result.returncode == 0, result.stderr
    return read_params(job)


def test_a_new_job_starts_from_the_source_and_resumes_from_itself(source, fresh, tmp_path):
    job = tmp_path / "job"
    result = _train(job, 1, "--init-from", str(source), *FROZEN)
    assert result.returncode == 0, result.stderr
    started, trained = read_params(job), read_params(source)
    assert started.keys() == trained.keys() and started.keys() == fresh.keys()
    for key, value in trained.items():
        np.testing.assert_allclose(started[key], value, rtol=0, atol=ATOL, err_msg=key)
        assert np.abs(fresh[key] - value).max() > 1e-3, key
    moved = tmp_path / "moved"
    shutil.move(source, moved)  # a resumed job must not need its source
    try:
        again = run_pax("train", "--job-dir", str(job), "--set", "NUM_TRAIN_STEPS=2")
    finally:
        shutil.move(moved, source)
    assert again.returncode == 0, again.stderr
    assert "resuming from step 1" in again.stdout


@pytest.mark.parametrize("sets", [
    # init_from_ignore: the biases keep their fresh values whatever the source holds.
    ["task.train.init_from_ignore=('.*bias',)"],
    # init_from_optional: the kernels, which the source holds, come from it; the biases, which
    # a rule sends to names the source lacks, keep their fresh values instead of stopping it.
    ["task.train.init_from_rules=[('(.*)bias', '{}missing'), ('(.*)', '{}')]",
     "task.train.init_from_optional=('.*',)"],
], ids=["ignored", "optional"])
def test_ignored_or_optional_parameters_missing_at_the_source_keep_their_fresh_values(
        source, fresh, tmp_path, sets):
    job = tmp_path / "job"
    result = _train(job, 1, "--init-from", str(source), *FROZEN,
                    *(a for item in sets for a in ("--set", item)))
    assert result.returncode == 0, result.stderr
    started, trained = read_params(job), read_params(source)
    biases = [k for k in started if k.endswith("['bias']")]
    assert biases and len(biases) < len(started)
    for key in started:
        np.testing.assert_allclose(started[key], fresh[key] if key in biases else trained[key],
                                   rtol=0, atol=ATOL, err_msg=key)


@pytest.mark.parametrize(("rules", "expected"), [
    ("[('(.*)kernel', '{}weights')]", ("cannot be initialised", "init_from_partial")),
    ("[('(.*)', '{}/{}')]", ("does not fill in for parameter",)),
], ids=["maps-to-nothing", "wants-more-groups"])
def test_a_rule_that_cannot_be_followed_stops_the_run_before_anything_is_saved(
        source, tmp_path, capfd, rules, expected):
    """``pax train --init-from`` in this process: the usage error (exit 2) that the command
    prints as its one line, and nothing else said (``pax`` itself: the next test)."""
    job = tmp_path / "job"
    with pytest.raises(UsageError) as refused:
        train(isolated_host(), exp="MlpSynthetic", plugin=None, job_dir=str(job),
              set_items=["NUM_TRAIN_STEPS=1", f"task.train.init_from={str(source)!r}",
                         f"task.train.init_from_rules={rules}"])
    message = str(refused.value)
    assert all(part in message for part in expected), message
    assert "\n" not in message and refused.value.exit_code == 2
    assert capfd.readouterr().err == ""
    assert not (job / "checkpoints").exists() or not any((job / "checkpoints").iterdir())


def test_a_source_that_is_not_a_model_stops_in_one_line(tmp_path):
    (tmp_path / "notes").mkdir()
    result = _train(tmp_path / "job", 1, "--init-from", str(tmp_path / "notes"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "is neither a job directory" in result.stderr
