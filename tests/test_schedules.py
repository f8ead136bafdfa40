"""Learning-rate schedules: the multiplier at each phase, and refusing impossible settings.

Values are checked at step 0, mid-warm-up, end of warm-up, the hold, decay start, middle of the
decay, decay end and after it, evaluated under ``jax.jit`` as the optimizer does. Invalid
arguments raise ``ValueError`` naming the argument, and through ``pax train`` end in exit code 2
with one line and nothing written.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_core.cli.main import main
from pax_core.config.schedules import (
    Constant,
    LinearRampupCosineDecay,
    LinearRampupExponentialDecay,
)

STEPS = [0, 5, 10, 15, 20, 30, 40, 100]
RAMP = dict(warmup_steps=10, decay_start=20, decay_end=40, max=2.0)


def _at_steps(schedule) -> np.ndarray:
    return np.asarray(jax.jit(schedule)(jnp.asarray(STEPS)))


def test_constant_is_the_same_at_every_step():
    np.testing.assert_array_equal(_at_steps(Constant(0.5)), [0.5] * len(STEPS))


def test_exponential_decay_ramps_holds_and_decays_geometrically():
    schedule = LinearRampupExponentialDecay(**RAMP, min_ratio=0.01)
    middle = 2.0 * 0.01**0.5
    np.testing.assert_allclose(_at_steps(schedule), [0, 1, 2, 2, 2, middle, 0.02, 0.02],
                               rtol=1e-6)


def test_cosine_decay_ramps_holds_and_is_halfway_in_the_middle():
    schedule = LinearRampupCosineDecay(**RAMP, min_ratio=0.1)
    middle = (2.0 + 0.2) / 2
    np.testing.assert_allclose(_at_steps(schedule), [0, 1, 2, 2, 2, middle, 0.2, 0.2],
                               rtol=1e-6)


@pytest.mark.parametrize("cls", [LinearRampupExponentialDecay, LinearRampupCosineDecay])
def test_no_warmup_starts_at_max(cls):
    assert float(cls(warmup_steps=0, decay_start=0, decay_end=10, max=3.0)(0)) == 3.0


@pytest.mark.parametrize(
    ("cls", "kwargs", "message"),
    [
        (LinearRampupExponentialDecay, dict(warmup_steps=-1, decay_start=0, decay_end=1),
         "LinearRampupExponentialDecay: warmup_steps must be >= 0, got -1"),
        (LinearRampupCosineDecay, dict(warmup_steps=10, decay_start=5, decay_end=20),
         "LinearRampupCosineDecay: decay_start (5) must be >= warmup_steps (10)"),
        (LinearRampupExponentialDecay, dict(warmup_steps=10, decay_start=11, decay_end=5),
         "LinearRampupExponentialDecay: decay_end (5) must be >= decay_start (11)"),
        (LinearRampupCosineDecay, dict(warmup_steps=0, decay_start=0, decay_end=1, max=0.0),
         "LinearRampupCosineDecay: max must be > 0, got 0.0"),
        (LinearRampupExponentialDecay, dict(warmup_steps=0, decay_start=0, decay_end=1,
                                            min_ratio=0.0),
         "LinearRampupExponentialDecay: min_ratio must be in (0, 1], got 0.0"),
        (LinearRampupCosineDecay, dict(warmup_steps=0, decay_start=0, decay_end=1,
                                       min_ratio=1.5),
         "LinearRampupCosineDecay: min_ratio must be in [0, 1], got 1.5"),
    ],
    ids=["negative-warmup", "decay-before-warmup-ends", "decay-ends-before-it-starts",
         "zero-max", "exponential-zero-min-ratio", "cosine-min-ratio-above-1"],
)
def test_invalid_arguments_raise_value_error_naming_them(cls, kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        cls(**kwargs)


def test_invalid_schedule_set_on_the_cli_exits_2_with_one_line(capsys, tmp_path):
    job_dir = tmp_path / "job"
    with pytest.raises(SystemExit) as exited:
        main(["train", "--exp", "MlpSynthetic", "--job-dir", str(job_dir),
              "--set", "task.train.learner.optimizer.lr_schedule.decay_end=5",
              "--set", "task.train.learner.optimizer.lr_schedule.decay_start=11"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "pax: error: the config of core/MlpSynthetic does not build: ValueError: "
        "LinearRampupCosineDecay: decay_end (5) must be >= decay_start (11)\n"
    )
    assert not job_dir.exists()
