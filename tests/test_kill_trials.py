"""kill -9 at random moments, many times, on one device and on eight: every rerun resumes from
the newest complete checkpoint, none is damaged, and the run ends bitwise where a run left
alone ends, step by step (input order and random keys included)."""

from __future__ import annotations

import concurrent.futures

import pytest

from pax_core.testing import assert_same_params, kill_trials, read_params, train_losses

pytestmark = pytest.mark.slow

STEPS = 400
ARGS = ["--exp", "MlpSynthetic", "--set", f"NUM_TRAIN_STEPS={STEPS}",
        "--set", "task.train.save_interval_steps=1", "--set", "task.train.save_max_to_keep=2",
        "--set", "task.train.summary_interval_steps=1",
        "--set", "task.train.eval_interval_steps=100"]
TRIALS = 25  # per mesh: 50 in all


def _devices(count: int) -> dict[str, str]:
    return {"JAX_PLATFORMS": "cpu",
            "XLA_FLAGS": f"--xla_force_host_platform_device_count={count}"}


def _chain(tmp_path, devices: int):
    """A killed-and-resumed run and one left alone, on ``devices`` devices."""
    killed = kill_trials(ARGS, tmp_path / f"killed-{devices}", trials=TRIALS, seed=devices,
                         env=_devices(devices))
    straight = kill_trials(ARGS, tmp_path / f"straight-{devices}", trials=0,
                           env=_devices(devices))
    return killed, straight


def test_kill_9_at_random_moments_resumes_bitwise_on_one_and_eight_devices(tmp_path):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        chains = dict(zip((1, 8), pool.map(lambda d: _chain(tmp_path, d), (1, 8)),
                          strict=True))
    for devices, (killed, straight) in chains.items():
        assert straight.finished.returncode == 0, straight.finished.stderr
        assert killed.finished.returncode == 0, killed.finished.stderr
        assert killed.tracebacks == [], killed.tracebacks[0]
        assert killed.damaged == [], killed.damaged
        assert killed.killed >= TRIALS * 0.8, (devices, killed.killed)
        assert killed.resumed == sorted(killed.resumed), killed.resumed  # nothing committed lost
        print(f"{devices} device(s): {killed.killed} of {killed.tried} runs killed, resumed from "
              f"steps {killed.resumed}, {killed.unfinished_removed} unfinished saves removed, "
              f"{len(killed.damaged)} damaged")
        assert "Removing existing directory" not in killed.finished.stderr
        killed_dir, straight_dir = tmp_path / f"killed-{devices}", tmp_path / f"straight-{devices}"
        losses = train_losses(killed_dir)
        assert sorted(losses) == list(range(1, STEPS + 1)), devices
        assert losses == train_losses(straight_dir), devices
        assert_same_params(read_params(killed_dir), read_params(straight_dir))
