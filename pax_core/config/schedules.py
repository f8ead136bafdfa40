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


@dataclasses.dataclass(frozen=True)
class LinearRampupPiecewiseConstant:
    """A linear ramp from 0 to ``values[0]`` at ``boundaries[0]``, then ``values[i]`` from
    ``boundaries[i]`` until the next boundary (Pax's LinearRampupPiecewiseConstant: its
    ResNets ramp for 5 epochs and divide by 10 at epochs 30, 60 and 80)."""

    boundaries: tuple[int, ...]
    values: tuple[float, ...]

    def __post_init__(self):
        name = type(self).__name__
        if not self.boundaries or len(self.boundaries) != len(self.values):
            raise ValueError(f"{name}: boundaries and values must be non-empty and of one "
                             f"length, got {len(self.boundaries)} and {len(self.values)}")
        if any(b < 0 for b in self.boundaries) or list(self.boundaries) != sorted(
                self.boundaries):
            raise ValueError(f"{name}: boundaries must be >= 0 and increasing, got "
                             f"{list(self.boundaries)}")

    def __call__(self, step):
        step = jnp.asarray(step, jnp.float32)
        first = self.boundaries[0]
        ramp = self.values[0] * (jnp.minimum(step / first, 1.0) if first > 0 else 1.0)
        piece = jnp.sum(step[..., None] >= jnp.asarray(self.boundaries[1:], jnp.float32),
                        axis=-1) if len(self.boundaries) > 1 else jnp.zeros_like(step, jnp.int32)
        held = jnp.asarray(self.values, jnp.float32)[piece]
        return jnp.where(step < first, ramp, held)
