"""kill -9 at random moments, many times, on one device and on eight: every rerun resumes from
the newest complete checkpoint, none is damaged, and the run ends bitwise where a run left
alone ends, step by step (input order and random keys included). CI runs a seeded sample;
``nox -s soak`` runs over a hundred. Only runs that SIGKILL killed mid-run count as trials."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pax_core.testing import fault_trials, kill_and_compare
from pax_core.testing.faults import _kill_runs

TRIALS = fault_trials(12, 50)  # per mesh: CI's seeded sample of 24, a soak's 100
# Each trial trains for half a second or so, a few steps: the job must outlast its trials, or
# the last ones find it finished and the kill times are too late.
STEPS = fault_trials(50, 400)
ARGS = ["--exp", "MlpSynthetic", "--set", f"NUM_TRAIN_STEPS={STEPS}",
        "--set", "task.train.save_interval_steps=1", "--set", "task.train.save_max_to_keep=2",
        "--set", "task.train.summary_interval_steps=1",
        "--set", "task.train.eval_interval_steps=100"]


@pytest.mark.slow
def test_kill_9_at_random_moments_resumes_bitwise_on_one_and_eight_devices(tmp_path):
    for devices, killed in kill_and_compare(ARGS, tmp_path, trials=TRIALS, steps=STEPS).items():
        assert killed.killed == TRIALS, (devices, killed.killed)
        assert "Removing existing directory" not in killed.finished.stderr
        print(f"{devices} device(s): {killed.killed} runs killed mid-run ({killed.redrawn} more "
              f"ended before their kill and were redrawn), resumed from steps {killed.resumed}, "
              f"{killed.unfinished_removed} unfinished saves removed, {len(killed.damaged)} "
              f"damaged")


# What the trials count, with a stand-in for `pax train` (a real process, seconds shorter):
# "train" logs a record every 20 ms until it is killed; "end-first" ends at once the first time
# (as a run that trained its job to the end does), then trains; "fail" fails on its own.
RUN = """
import pathlib, sys, time
job, how = pathlib.Path(sys.argv[1]), sys.argv[2]
if how == "fail":
    sys.exit("the run broke")
if how == "end-first" and not (job / "ran").exists():
    (job / "ran").touch()
    sys.exit(0)
with open(job / "metrics.jsonl", "a") as metrics:
    while True:
        metrics.write("{}\\n")
        metrics.flush()
        time.sleep(0.02)
"""
# Seed 0's first trial kills once a step is logged (the early kills are a quarter), so a run
# that logs none is seen to end, whatever the machine's speed.
SEED = 0


def _runs(tmp_path, how: str, trials: int, redraws: int) -> tuple[int, int, list[str]]:
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    output: list[str] = []
    def start(log):
        with open(log, "w") as out:
            return subprocess.Popen([sys.executable, "-c", RUN, str(tmp_path), how], stdout=out,
                                    stderr=out)

    killed, redrawn = _kill_runs(start, tmp_path, logs, output.append, trials=trials, seed=SEED,
                                 redraws=redraws)
    return killed, redrawn, output


def test_a_run_that_ends_before_its_kill_is_redrawn_not_counted(tmp_path):
    assert _runs(tmp_path, "end-first", trials=2, redraws=1)[:2] == (2, 1)
    assert len(list((tmp_path / "logs").glob("*.err"))) == 3


def test_runs_ending_before_their_kill_past_the_redraws_fail_as_too_late(tmp_path):
    with pytest.raises(AssertionError, match="kill times are too late: runs ended before "
                                             "their kill 1 times, past the 0 redraws that 2"):
        _runs(tmp_path, "end-first", trials=2, redraws=0)


def test_a_run_that_fails_on_its_own_is_an_error_with_its_output(tmp_path):
    with pytest.raises(AssertionError, match=r"(?s)exit status 1 before its kill.*the run broke"):
        _runs(tmp_path, "fail", trials=1, redraws=3)
