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


@dataclasses.dataclass(frozen=True)
class _RampThenDecay:
    """Linear warm-up from 0 to ``max``, hold until ``decay_start``, decay to ``max * min_ratio``
    at ``decay_end``, hold after it. Subclasses give the shape of the decay."""

    warmup_steps: int
    decay_start: int
    decay_end: int
    min_ratio: float = 0.0
    max: float = 1.0

    def __post_init__(self):
        name = type(self).__name__
        if self.warmup_steps < 0:
            raise ValueError(f"{name}: warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.decay_start < self.warmup_steps:
            raise ValueError(f"{name}: decay_start ({self.decay_start}) must be >= warmup_steps "
                             f"({self.warmup_steps})")
        if self.decay_end < self.decay_start:
            raise ValueError(f"{name}: decay_end ({self.decay_end}) must be >= decay_start "
                             f"({self.decay_start})")
        if self.max <= 0:
            raise ValueError(f"{name}: max must be > 0, got {self.max}")

    def _decay(self, progress):
        """The multiplier at ``progress`` ∈ [0, 1] of the decay."""
        raise NotImplementedError

    def __call__(self, step):
        step = jnp.asarray(step, jnp.float32)
        if self.warmup_steps == 0:
            ramp = jnp.full_like(step, self.max)
        else:
            ramp = self.max * jnp.minimum(step / self.warmup_steps, 1.0)
        span = max(self.decay_end - self.decay_start, 1)
        progress = jnp.clip((step - self.decay_start) / span, 0.0, 1.0)
        return jnp.where(step < self.decay_start, ramp, self._decay(progress))


@dataclasses.dataclass(frozen=True)
class LinearRampupExponentialDecay(_RampThenDecay):
    """Exponential decay after the ramp (Pax's LinearRampupExponentialDecay)."""

    min_ratio: float = 0.01

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.min_ratio <= 1:
            raise ValueError(f"LinearRampupExponentialDecay: min_ratio must be in (0, 1], "
                             f"got {self.min_ratio}")

    def _decay(self, progress):
        return self.max * jnp.exp(math.log(self.min_ratio) * progress)


@dataclasses.dataclass(frozen=True)
class LinearRampupCosineDecay(_RampThenDecay):
    """Half a cosine down after the ramp (Pax's LinearRampupCosineDecay)."""

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.min_ratio <= 1:
            raise ValueError(f"LinearRampupCosineDecay: min_ratio must be in [0, 1], "
                             f"got {self.min_ratio}")

    def _decay(self, progress):
        low = self.max * self.min_ratio
        return low + (self.max - low) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
