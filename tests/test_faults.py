"""Runs that must end well: stop requests (real processes, real signals), divergence, bad
settings, a resume past the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from pax_core.errors import RunError, UsageError
from pax_core.testing import isolated_host, read_metrics, run_pax, train

LONG = ["--exp", "MlpSynthetic", "--set", "NUM_TRAIN_STEPS=1000000"]


def _start(job_dir: Path) -> subprocess.Popen:
    pax = Path(sys.executable).with_name("pax")
    return subprocess.Popen([str(pax), "train", *LONG, "--job-dir", str(job_dir)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PAX_STRICT_PLUGINS": "1"})


def _wait_for_training(job_dir: Path, timeout: float = 120) -> None:
    """Until the run has logged a train summary: it is past compiling and stepping."""
    deadline = time.monotonic() + timeout
    metrics = job_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and '"kind": "train"' in metrics.read_text():
            return
        time.sleep(0.05)
    raise AssertionError("the run did not start training")


def _steps_saved(job_dir: Path) -> list[int]:
    return sorted(int(p.name) for p in (job_dir / "checkpoints").iterdir() if p.name.isdigit())


@pytest.mark.slow
@pytest.mark.serial
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_request_saves_exits_with_the_signal_status_and_resumes(tmp_path, signum):
    job = tmp_path / "job"
    run = _start(job)
    _wait_for_training(job)
    run.send_signal(signum)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signum, err
    assert "Traceback" not in err and "error" not in err, err
    name = signal.Signals(signum).name
    assert f"pax: stopped on request ({name}) at step " in err
    stopped_at = int(err.split(" at step ")[1].split(";")[0])
    assert _steps_saved(job)[-1] == stopped_at
    assert not [p for p in (job / "checkpoints").iterdir() if not p.name.isdigit()]
    resumed = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(job), "--set",
                      f"NUM_TRAIN_STEPS={stopped_at + 20}")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from step {stopped_at} of {stopped_at + 20}" in resumed.stdout
    assert _steps_saved(job)[-1] == stopped_at + 20


@pytest.mark.slow
@pytest.mark.serial
def test_repeated_ctrl_c_still_finishes_the_save(tmp_path):
    job = tmp_path / "job"
    run = _start(job)
    _wait_for_training(job)
    for _ in range(3):
        run.send_signal(signal.SIGINT)
        time.sleep(0.02)
    _, err = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGINT, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    stopped_at = int(err.split(" at step ")[1].split(";")[0])
    assert _steps_saved(job)[-1] == stopped_at
    assert not [p for p in (job / "checkpoints").iterdir() if not p.name.isdigit()]


@pytest.mark.slow
@pytest.mark.parametrize("signum, delay", [(signal.SIGINT, 0.3), (signal.SIGINT, 1.5),
                                           (signal.SIGTERM, 1.0)])
def test_a_stop_request_during_start_up_is_one_line_and_never_lost(tmp_path, signum, delay):
    """Start-up is imports, plugins, JAX, compiling: a request at any moment of it ends the run
    with one line and the signal's status, before it trains to the end."""
    run = _start(tmp_path / "job")
    time.sleep(delay)
    run.send_signal(signum)
    try:
        _, err = run.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        run.kill()
        raise AssertionError(f"{signum.name} after {delay} s was lost: the run went on "
                             f"training") from None
    assert run.returncode == 128 + signum, err
    assert err.count("\n") == 1 and err.startswith(f"pax: stopped on request ({signum.name})"), err


# Divergence: an input that hands the model NaN features at chosen batches.

EXPERIMENT = textwrap.dedent("""
    import dataclasses

    import fiddle as fdl
    import numpy as np

    from pax_core import SyntheticInput
    from pax_core.examples import MlpSynthetic


    @dataclasses.dataclass
    class PoisonedInput(SyntheticInput):
        poisoned: tuple = ()

        def get_next(self):
            index = self.index
            batch = super().get_next()
            if index in self.poisoned:
                batch["features"] = np.full_like(batch["features"], np.nan)
            return batch


    class Poisoned(MlpSynthetic):
        NUM_TRAIN_STEPS = 12
        POISONED = (3, 5)

        def task(self):
            task = super().task()
            task.train.save_interval_steps = 2
            task.train.summary_interval_steps = 4
            return task

        def datasets(self):
            train, test = super().datasets()
            train = fdl.Config(PoisonedInput, poisoned=self.POISONED, **train.__arguments__)
            return [train, test]
""")


@pytest.fixture
def poisoned(tmp_path, monkeypatch):
    (tmp_path / "poisoned_exp.py").write_text(EXPERIMENT)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "poisoned_exp:Poisoned"


def test_a_non_finite_step_stops_the_run_before_it_is_saved(tmp_path, poisoned):
    job = tmp_path / "job"
    with pytest.raises(RunError, match=r"training diverged: the loss or the gradients were not "
                                       r"finite at step 4 .*the newest checkpoint, step 2, is "
                                       r"from before it.*on_anomaly='skip'"):
        train(isolated_host(), exp=poisoned, plugin=None, set_items=[], job_dir=str(job))
    assert _steps_saved(job) == [2]
    summaries = [r for r in read_metrics(job) if r.get("kind") == "train"]
    assert summaries == []  # step 4's summary was never logged: the check comes first


def test_skip_on_anomaly_skips_and_counts_the_updates(tmp_path, poisoned):
    job = tmp_path / "job"
    status = train(isolated_host(), exp=poisoned, plugin=None, job_dir=str(job),
                   set_items=["task.train.learner.on_anomaly='skip'"])
    assert status == "completed"
    summaries = {r["step"]: r for r in read_metrics(job) if r.get("kind") == "train"}
    assert [summaries[s]["skipped_steps"] for s in (4, 8, 12)] == [1.0, 1.0, 0.0]
    assert all(r["loss"] == r["loss"] for r in summaries.values())  # finite, not NaN
    evals = [r for r in read_metrics(job) if r.get("kind") == "eval/test"]
    assert evals and all(r["loss"] < 10 for r in evals)


def test_a_skipped_step_leaves_the_state_as_it_was(tmp_path, poisoned):
    """Skipping batch 3 (step 4) gives the parameters of a run that never saw it: the same
    parameters after step 3 and after step 4."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    def flat(tree):
        return np.concatenate([np.ravel(x) for x in jax.tree.leaves(tree)])

    def params_at(job, step):
        restored = ocp.StandardCheckpointer().restore(job / "checkpoints" / str(step) / "state")
        return restored["params"]

    job = tmp_path / "job"
    train(isolated_host(), exp=poisoned, plugin=None, job_dir=str(job),
          set_items=["task.train.learner.on_anomaly='skip'", "POISONED=(3,)",
                     "task.train.save_interval_steps=1", "task.train.save_max_to_keep=20",
                     "NUM_TRAIN_STEPS=5"])
    before, after, later = (flat(params_at(job, s)) for s in (3, 4, 5))
    assert np.array_equal(before, after)
    assert not np.array_equal(after, later)


# Bad settings: one line, exit 2, nothing written.


def test_a_learning_rate_that_is_not_a_positive_number_is_refused(tmp_path):
    """Through the ``pax`` command; every kind of bad rate is the next test's."""
    result = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(tmp_path / "job"),
                     "--set", "LEARNING_RATE=0")
    assert result.returncode == 2, result.stderr
    assert "learning_rate must be a finite number > 0" in result.stderr
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize("value", ["1e999", "-1e999", "-1e-3", "0"])
def test_each_learning_rate_that_is_not_a_positive_number_is_refused(tmp_path, capfd, value):
    """``pax train`` in this process: the usage error (exit 2) that the command prints as its
    one line, and nothing else said (the test above)."""
    with pytest.raises(UsageError) as refused:
        train(isolated_host(), exp="MlpSynthetic", plugin=None,
              set_items=[f"LEARNING_RATE={value}"], job_dir=str(tmp_path / "job"))
    assert "learning_rate must be a finite number > 0" in str(refused.value)
    assert "\n" not in str(refused.value) and refused.value.exit_code == 2
    assert capfd.readouterr().err == ""
    assert not (tmp_path / "job").exists()


def test_on_anomaly_takes_only_its_choices(tmp_path):
    result = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(tmp_path / "job"),
                     "--set", "task.train.learner.on_anomaly='ignore'")
    assert result.returncode == 2
    assert "on_anomaly must be one of stop, skip" in result.stderr


@pytest.mark.slow
def test_a_resume_past_num_train_steps_is_refused(tmp_path):
    job = tmp_path / "job"
    assert run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(job), "--set",
                   "NUM_TRAIN_STEPS=10").returncode == 0
    runs = (job / "runs.jsonl").read_text()
    fewer = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(job), "--set",
                    "NUM_TRAIN_STEPS=5")
    assert fewer.returncode == 2
    assert "is at step 10, past num_train_steps 5" in fewer.stderr
    assert (job / "runs.jsonl").read_text() == runs
    assert json.loads(runs.splitlines()[-1])["overrides"] == ["NUM_TRAIN_STEPS=10"]
