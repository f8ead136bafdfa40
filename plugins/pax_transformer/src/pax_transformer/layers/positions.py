"""Where a token is: rotary (on queries and keys), sinusoidal or learned (added to the inputs).

Every variant takes explicit ``positions`` [B, L] rather than assuming ``arange(L)``: packed
sequences restart at 0 in each segment, and a decoding step sits at its cache index.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.typing import Initializer

from pax_core import axes
from pax_transformer.layers.initializers import partitioned

POSITIONS = ("rotary", "sinusoidal", "learned", "none")


def sinusoidal(positions: jax.Array, dims: int, dtype: Any = jnp.float32) -> jax.Array:
    """Pax's sinusoidal table: [sin | cos] over geometric timescales from 1 to 10000.

    positions [B, L] -> [B, L, dims]; an odd ``dims`` gets one zero column at the end.
    """
    half = dims // 2
    increment = math.log(10000.0) / max(half - 1, 1)
    inv_timescales = jnp.exp(jnp.arange(half, dtype=jnp.float32) * -increment)
    scaled = positions.astype(jnp.float32)[..., None] * inv_timescales
    signal = jnp.concatenate([jnp.sin(scaled), jnp.cos(scaled)], axis=-1)
    signal = jnp.pad(signal, [(0, 0)] * (signal.ndim - 1) + [(0, dims % 2)])
    return signal.astype(dtype)


def apply_rotary(x: jax.Array, positions: jax.Array, base: float = 10000.0) -> jax.Array:
    """Rotate ``x`` [B, L, N, H] by its positions [B, L], rotate-half convention (H even).

    Dimension i of the first half pairs with dimension i of the second half and turns by
    ``position / base**(2i/H)``; computed in float32 and returned in ``x``'s dtype.
    """
    half = x.shape[-1] // 2
    timescale = base ** (2.0 * jnp.arange(half, dtype=jnp.float32) / x.shape[-1])
    angle = positions.astype(jnp.float32)[:, :, None, None] / timescale
    sin, cos = jnp.sin(angle), jnp.cos(angle)
    first, second = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)
    return rotated.astype(x.dtype)


class LearnedPositions(nn.Module):
    """A trainable [max_seq_len, model_dims] table, looked up by position."""

    max_seq_len: int
    model_dims: int
    init: Initializer
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, positions: jax.Array) -> jax.Array:
        table = self.param(
            "embedding",
            partitioned(self.init, (None, axes.EMBED)),
            (self.max_seq_len, self.model_dims),
            self.param_dtype,
        )
        return jnp.take(table, positions, axis=0).astype(self.dtype)
