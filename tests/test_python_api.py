"""Pax from Python (``pax_core.train``, ``evaluate``, ``load``): two trainings in a row in one
process, each the same as the other and as its job's metrics.jsonl says; the job evaluated and
loaded back; mistakes raised as ``UsageError``, never an exit."""

from __future__ import annotations

import io
import re
import sys

import jax
import numpy as np
import pytest

import pax_core
from pax_core import MlpClassifier, UsageError
from pax_core.testing import read_metrics

STEPS = 4
OVERRIDES = {"NUM_TRAIN_STEPS": STEPS, "SUMMARY_INTERVAL_STEPS": 2,
             "CHECKPOINT_EVERY_N_STEPS": 2, "HIDDEN_DIMS": (8,)}


def _numbers(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in ("step", "kind", "time")}


def _last(job_dir, kind: str) -> dict:
    return [r for r in read_metrics(job_dir) if r["kind"] == kind][-1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two jobs trained one after the other in this process: the second's overrides as
    ``--set`` items spelling the first's, and the stdout of both."""
    root = tmp_path_factory.mktemp("python_api")
    capture = pytest.MonkeyPatch()
    out = io.StringIO()
    capture.setattr(sys, "stdout", out)
    try:
        first = pax_core.train("MlpSynthetic", root / "first", overrides=OVERRIDES)
        second = pax_core.train("MlpSynthetic", str(root / "second"),
                                overrides=[f"{k}={v!r}" for k, v in OVERRIDES.items()])
    finally:
        capture.undo()
    return root, first, second, out.getvalue()


def test_a_training_returns_what_its_job_records(trained):
    root, first, second, _ = trained
    for result, name in ((first, "first"), (second, "second")):
        job = root / name
        assert result.step == STEPS and result.job_dir == str(job)
        train = _last(job, "train")
        assert train["step"] == STEPS and result.train_metrics == _numbers(train)
        evals = _last(job, "eval/test")
        assert evals["step"] == STEPS and result.eval_metrics == {"test": _numbers(evals)}
        assert result.loss == train["loss"]
        assert result.checkpoints == str(job / "checkpoints")
        assert (job / "checkpoints" / str(STEPS)).is_dir()
        assert result.wall_time_sec > 0


def test_two_trainings_in_one_process_are_the_same_training(trained):
    _, first, second, printed = trained
    assert second.loss == first.loss
    assert second.eval_metrics == first.eval_metrics
    # What a notebook shows: the console's step lines, plain, for both runs.
    assert len(re.findall(rf"^step {STEPS}/{STEPS} loss=", printed, re.M)) == 2
    assert len(re.findall(rf"^step {STEPS} eval/test .*loss=", printed, re.M)) == 2
    assert "\x1b[" not in printed


def test_evaluate_gives_the_metrics_of_the_saved_step(trained):
    root, first, _, _ = trained
    result = pax_core.evaluate(root / "first")
    assert result.step == STEPS and set(result.metrics) == {"test"}
    assert result.metrics["test"]["loss"] == pytest.approx(first.eval_metrics["test"]["loss"],
                                                           rel=1e-6)
    earlier = pax_core.evaluate(root / "first", step=2)
    assert earlier.step == 2 and earlier.metrics["test"]["loss"] != result.metrics["test"]["loss"]


def test_load_restores_the_model_and_its_parameters(trained):
    root, first, _, _ = trained
    job = pax_core.load(root / "first")
    assert (job.step, job.experiment, job.job_dir) == (STEPS, "core/MlpSynthetic",
                                                       str(root / "first"))
    assert isinstance(job.model, MlpClassifier) and job.model.hidden_dims == (8,)
    assert job.config.task.train.num_train_steps == STEPS
    shapes = {k: v.shape for k, v in job.params["Dense_0"].items()}
    assert shapes == {"kernel": (16, 8), "bias": (8,)}
    # The loaded model gives the training's final eval loss on the eval input's batches.
    evaluator = job.run.eval_inputs[0]
    losses = []
    for _ in range(4):
        batch = evaluator.get_next()
        losses.append(float(job.model.apply(job.variables(), batch).loss))
    assert np.mean(losses) == pytest.approx(first.eval_metrics["test"]["loss"], rel=1e-5)
    earlier = pax_core.load(root / "first", step=2)
    assert earlier.step == 2
    assert not np.array_equal(jax.device_get(earlier.params["Dense_0"]["kernel"]),
                              jax.device_get(job.params["Dense_0"]["kernel"]))


def test_mistakes_are_raised_not_exits(tmp_path):
    with pytest.raises(UsageError, match="NoSuchExperiment"):
        pax_core.train("NoSuchExperiment", tmp_path / "job", overrides={"NUM_TRAIN_STEPS": 1})
    assert not (tmp_path / "job").exists()
    with pytest.raises(UsageError, match=r"the value of NUM_TRAIN_STEPS \(object\) is not a "
                                         r"Python literal"):
        pax_core.train("MlpSynthetic", tmp_path / "job", overrides={"NUM_TRAIN_STEPS": object()})
    with pytest.raises(UsageError, match="not one string"):
        pax_core.train("MlpSynthetic", tmp_path / "job", overrides="NUM_TRAIN_STEPS=1")
    with pytest.raises(UsageError, match="job_dir is empty"):
        pax_core.train("MlpSynthetic", "", overrides={"NUM_TRAIN_STEPS": 1})
    with pytest.raises(UsageError, match="no checkpoint in"):
        pax_core.evaluate(tmp_path / "job")
    with pytest.raises(UsageError, match="no checkpoint in"):
        pax_core.load(tmp_path / "job")
    assert not (tmp_path / "job").exists()


def test_a_job_of_an_experiment_file_is_read_back_naming_it(tmp_path, monkeypatch):
    """A job records an experiment from a file by its path only; reading the job imports
    registered code alone, so a caller who trusts the file names it, as --exp does."""
    (tmp_path / "mine.py").write_text(
        "from pax_core.examples import MlpSynthetic\n\n\n"
        "class Mine(MlpSynthetic):\n    HIDDEN_DIMS = (4,)\n")
    monkeypatch.chdir(tmp_path)
    overrides = {"NUM_TRAIN_STEPS": 2, "SUMMARY_INTERVAL_STEPS": 2}
    pax_core.train("mine.py:Mine", "job", overrides=overrides)
    with pytest.raises(UsageError, match=r"mine\.py:Mine.*exp='[^']*/mine\.py:Mine' from Python"):
        pax_core.load("job")
    assert pax_core.load("job", exp="mine.py:Mine").params["Dense_0"]["kernel"].shape[1] == 4
    assert "test" in pax_core.evaluate("job", exp="mine.py:Mine", overrides=overrides).metrics
