"""The tiny LM killed with SIGKILL at random moments resumes bitwise, on one device and on
eight: the text input's position and the model's random keys come back with the checkpoint."""

from __future__ import annotations

import concurrent.futures

import pytest

from pax_core.testing import assert_same_params, kill_trials, read_params, train_losses

pytestmark = pytest.mark.slow

STEPS = 40
ARGS = ["--exp", "TinyLmForTests", "--set", f"NUM_TRAIN_STEPS={STEPS}",
        "--set", "CHECKPOINT_EVERY_N_STEPS=1", "--set", "SUMMARY_INTERVAL_STEPS=1",
        "--set", "EVAL_INTERVAL_STEPS=1000"]
TRIALS = 6  # per mesh


def _chain(tmp_path, devices: int):
    env = {"JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
    killed = kill_trials(ARGS, tmp_path / f"killed-{devices}", trials=TRIALS, seed=devices,
                         env=env)
    straight = kill_trials(ARGS, tmp_path / f"straight-{devices}", trials=0, env=env)
    return killed, straight


def test_the_tiny_lm_killed_at_random_moments_resumes_bitwise(tmp_path):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        chains = dict(zip((1, 8), pool.map(lambda d: _chain(tmp_path, d), (1, 8)),
                          strict=True))
    for devices, (killed, straight) in chains.items():
        assert straight.finished.returncode == 0, straight.finished.stderr
        assert killed.finished.returncode == 0, killed.finished.stderr
        assert killed.tracebacks == [] and killed.damaged == [], killed
        assert killed.killed >= 1, devices
        assert killed.resumed == sorted(killed.resumed), killed.resumed
        killed_dir, straight_dir = tmp_path / f"killed-{devices}", tmp_path / f"straight-{devices}"
        losses = train_losses(killed_dir)
        assert sorted(losses) == list(range(1, STEPS + 1)), devices
        assert losses == train_losses(straight_dir), devices
        assert_same_params(read_params(killed_dir), read_params(straight_dir))
