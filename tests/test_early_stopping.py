"""Early stopping (Pax's TARGET_LOG_PPLX): a run ends at the eval that reaches its target, saves
that step, and a rerun of the same command trains no further."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pax_core.testing import read_metrics, run_pax

pytestmark = pytest.mark.slow

EXPERIMENT = '''
import fiddle as fdl

from pax_core import EarlyStopping
from pax_core.examples import MlpSynthetic


class EarlyMlp(MlpSynthetic):
    NUM_TRAIN_STEPS = 300
    METRIC = "loss"
    TARGET = 0.9
    DATASET = ""
    HIGHER_IS_BETTER = False

    def task(self):
        task = super().task()
        task.train.eval_interval_steps = 10
        task.train.early_stopping = fdl.Config(
            EarlyStopping, metric=self.METRIC, target=self.TARGET, dataset=self.DATASET,
            higher_is_better=self.HIGHER_IS_BETTER)
        return task
'''


@pytest.fixture
def exp(tmp_path) -> str:
    path = tmp_path / "early.py"
    path.write_text(textwrap.dedent(EXPERIMENT))
    return f"{path}:EarlyMlp"


def _steps(job: Path) -> list[int]:
    return sorted(int(p.name) for p in (job / "checkpoints").iterdir() if p.name.isdigit())


def test_the_run_stops_at_the_eval_that_reaches_its_target(tmp_path, exp):
    job = tmp_path / "job"
    first = run_pax("train", "--exp", exp, "--job-dir", str(job))
    assert first.returncode == 0, first.stderr
    [line] = [x for x in first.stdout.splitlines() if "reached its target" in x]
    step = int(line.split(" at step ")[1].split(" ")[0])
    assert 0 < step < 300 and step % 10 == 0, line
    assert "(eval/test loss " in line and " <= 0.9); training stopped early" in line
    assert _steps(job)[-1] == step
    records = read_metrics(job)
    assert max(r["step"] for r in records) == step
    evals = {r["step"]: r["loss"] for r in records if r["kind"] == "eval/test"}
    assert evals[step] <= 0.9 and all(v > 0.9 for s, v in evals.items() if s < step)
    assert json.loads((job / "target_reached.json").read_text())["step"] == step

    again = run_pax("train", "--exp", exp, "--job-dir", str(job))
    assert again.returncode == 0, again.stderr
    assert f"reached its target at step {step} (eval/test loss " in again.stdout
    assert "in an earlier run; nothing to train" in again.stdout
    assert read_metrics(job) == records and _steps(job)[-1] == step

    lower = run_pax("train", "--exp", exp, "--job-dir", str(job), "--set", "TARGET=0.5")
    assert lower.returncode == 0, lower.stderr
    assert _steps(job)[-1] > step


def test_a_metric_to_maximise(tmp_path, exp):
    result = run_pax("train", "--exp", exp, "--job-dir", str(tmp_path / "job"), "--set",
                     "METRIC='accuracy'", "--set", "TARGET=0.6", "--set", "HIGHER_IS_BETTER=True")
    assert result.returncode == 0, result.stderr
    assert "(eval/test accuracy " in result.stdout and " >= 0.6)" in result.stdout


def test_an_unknown_dataset_is_refused_before_anything_is_written(tmp_path, exp):
    result = run_pax("train", "--exp", exp, "--job-dir", str(tmp_path / "job"), "--set",
                     "DATASET='valid'")
    assert result.returncode == 2
    assert "task.train.early_stopping.dataset is 'valid', not one of the eval datasets (test)" in (
        result.stderr)
    assert not (tmp_path / "job").exists()


def test_a_metric_the_eval_does_not_report_is_named(tmp_path, exp):
    result = run_pax("train", "--exp", exp, "--job-dir", str(tmp_path / "job"), "--set",
                     "METRIC='log_pplx'")
    assert result.returncode == 1
    assert ("watches log_pplx of eval/test, which its eval does not report (it reports "
            "accuracy, loss") in result.stderr
