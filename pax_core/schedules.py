"""Learning-rate schedules under Pax's names.

Each schedule maps a step to a *multiplier* of the optimizer's ``learning_rate``, as in Pax. They
are dataclasses so that Fiddle can configure and serialize them.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Constant:
    """The same multiplier at every step."""

    value: float = 1.0

    def __call__(self, step):
        return jnp.full_like(jnp.asarray(step, jnp.float32), self.value)


def _check_ramp(name: str, warmup_steps: int, decay_start: int, decay_end: int, max: float):
    if warmup_steps < 0:
        raise ValueError(f"{name}: warmup_steps must be >= 0, got {warmup_steps}")
    if decay_start < warmup_steps:
        raise ValueError(f"{name}: decay_start ({decay_start}) must be >= warmup_steps "
                         f"({warmup_steps})")
    if decay_end < decay_start:
        raise ValueError(f"{name}: decay_end ({decay_end}) must be >= decay_start ({decay_start})")
    if max <= 0:
        raise ValueError(f"{name}: max must be > 0, got {max}")


def _ramp(step, warmup_steps: int, max: float):
    """Linear 0 → max over the warm-up, then max."""
    if warmup_steps == 0:
        return jnp.full_like(step, max)
    return max * jnp.minimum(step / warmup_steps, 1.0)


@dataclasses.dataclass(frozen=True)
class LinearRampupExponentialDecay:
    """Linear warm-up to ``max``, hold until ``decay_start``, then exponential decay to
    ``max * min_ratio`` at ``decay_end``, held after it (Pax's LinearRampupExponentialDecay)."""

    warmup_steps: int
    decay_start: int
    decay_end: int
    min_ratio: float = 0.01
    max: float = 1.0

    def __post_init__(self):
        _check_ramp(type(self).__name__, self.warmup_steps, self.decay_start, self.decay_end,
                    self.max)
        if not 0 < self.min_ratio <= 1:
            raise ValueError(f"LinearRampupExponentialDecay: min_ratio must be in (0, 1], "
                             f"got {self.min_ratio}")

    def __call__(self, step):
        step = jnp.asarray(step, jnp.float32)
        span = max(self.decay_end - self.decay_start, 1)
        progress = jnp.clip((step - self.decay_start) / span, 0.0, 1.0)
        decay = self.max * jnp.exp(math.log(self.min_ratio) * progress)
        return jnp.where(step < self.decay_start, _ramp(step, self.warmup_steps, self.max), decay)


@dataclasses.dataclass(frozen=True)
class LinearRampupCosineDecay:
    """Linear warm-up to ``max``, hold until ``decay_start``, then half a cosine down to
    ``max * min_ratio`` at ``decay_end``, held after it (Pax's LinearRampupCosineDecay)."""

    warmup_steps: int
    decay_start: int
    decay_end: int
    min_ratio: float = 0.0
    max: float = 1.0

    def __post_init__(self):
        _check_ramp(type(self).__name__, self.warmup_steps, self.decay_start, self.decay_end,
                    self.max)
        if not 0 <= self.min_ratio <= 1:
            raise ValueError(f"LinearRampupCosineDecay: min_ratio must be in [0, 1], "
                             f"got {self.min_ratio}")

    def __call__(self, step):
        step = jnp.asarray(step, jnp.float32)
        span = max(self.decay_end - self.decay_start, 1)
        progress = jnp.clip((step - self.decay_start) / span, 0.0, 1.0)
        low = self.max * self.min_ratio
        decay = low + (self.max - low) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
        return jnp.where(step < self.decay_start, _ramp(step, self.warmup_steps, self.max), decay)
