"""The tiny LM killed with SIGKILL at random moments resumes bitwise, on one device and on
eight: the text input's position and the model's random keys come back with the checkpoint.
Only runs that SIGKILL killed mid-run count as trials."""

from __future__ import annotations

import pytest

from pax_core.testing import fault_trials, kill_and_compare

pytestmark = pytest.mark.slow

TRIALS = fault_trials(8, 20)  # per mesh: CI's seeded sample of 16, a soak's 40
# Enough steps to outlast the trials (the soak's 20 reached step 20 of 100, CI's 8 about step
# 9), or the last ones find the job finished and the kill times are too late.
STEPS = fault_trials(24, 100)
ARGS = ["--exp", "TinyLmForTests", "--set", f"NUM_TRAIN_STEPS={STEPS}",
        "--set", "CHECKPOINT_EVERY_N_STEPS=1", "--set", "SUMMARY_INTERVAL_STEPS=1",
        "--set", "EVAL_INTERVAL_STEPS=1000"]


def test_the_tiny_lm_killed_at_random_moments_resumes_bitwise(tmp_path):
    for devices, killed in kill_and_compare(ARGS, tmp_path, trials=TRIALS, steps=STEPS).items():
        assert killed.killed == TRIALS, devices  # killed mid-run, each of them
        print(f"tiny LM, {devices} device(s): {killed.killed} runs killed mid-run "
              f"({killed.redrawn} more ended before their kill and were redrawn), resumed from "
              f"steps {killed.resumed}, {len(killed.damaged)} damaged")
