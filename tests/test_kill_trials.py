"""kill -9 at random moments, many times, on one device and on eight: every rerun resumes from
the newest complete checkpoint, none is damaged, and the run ends bitwise where a run left
alone ends, step by step (input order and random keys included). CI runs a seeded sample;
``nox -s soak`` runs over a hundred."""

from __future__ import annotations

import pytest

from pax_core.testing import fault_trials, kill_and_compare

pytestmark = pytest.mark.slow

STEPS = 400
ARGS = ["--exp", "MlpSynthetic", "--set", f"NUM_TRAIN_STEPS={STEPS}",
        "--set", "task.train.save_interval_steps=1", "--set", "task.train.save_max_to_keep=2",
        "--set", "task.train.summary_interval_steps=1",
        "--set", "task.train.eval_interval_steps=100"]
TRIALS = fault_trials(4, 50)  # per mesh: CI's seeded sample of 8, a soak's 100


def test_kill_9_at_random_moments_resumes_bitwise_on_one_and_eight_devices(tmp_path):
    for devices, killed in kill_and_compare(ARGS, tmp_path, trials=TRIALS, steps=STEPS).items():
        assert killed.killed >= TRIALS * 0.75, (devices, killed.killed)
        assert "Removing existing directory" not in killed.finished.stderr
        print(f"{devices} device(s): {killed.killed} of {killed.tried} runs killed, resumed from "
              f"steps {killed.resumed}, {killed.unfinished_removed} unfinished saves removed, "
              f"{len(killed.damaged)} damaged")
