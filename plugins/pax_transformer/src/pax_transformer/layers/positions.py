"""Where a token is: rotary (on queries and keys), sinusoidal or learned (added to the inputs).

Every variant takes explicit ``positions`` [B, L] rather than assuming ``arange(L)``: packed
sequences restart at 0 in each segment, and a decoding step sits at its cache index.

Rotary frequencies are computed once, in numpy float32, in the order of operations Hugging Face
transformers uses (``inv_freq = 1 / base**(arange(0, R, 2) / R)``, then its rope scaling), and a
token's angle is ``position * inv_freq`` in float32: at positions in the thousands an angle
carries an absolute error of about one float32 step (2.4e-4 at 4000), so a checkpoint trained
with those numbers only reproduces its logits when the angles are rounded the same way.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.typing import Initializer
from jax.ad_checkpoint import checkpoint_name

from pax_core import axes
from pax_transformer.layers import remat
from pax_transformer.layers.initializers import partitioned

POSITIONS = ("rotary", "sinusoidal", "learned", "none", "sinusoidal_rotary")
# The positions that rotate queries and keys ("sinusoidal_rotary" also adds the sinusoid to the
# inputs, as praxis computes when its attention's rotary is on).
ROTARY_POSITIONS = ("rotary", "sinusoidal_rotary")
ROTARY_SCALINGS = ("none", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class RotaryScaling:
    """How rotary frequencies are stretched for contexts longer than the ones trained on.

    ``kind`` "none" keeps them; "linear" divides every frequency by ``factor`` (position
    interpolation, Hugging Face's rope_type "linear"); "llama3" (Llama 3.1's) keeps the high
    frequencies (wavelength below ``original_max_len / high_freq_factor``), divides the low ones
    (wavelength above ``original_max_len / low_freq_factor``) by ``factor`` and blends the ones
    between.
    """

    kind: str = "none"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_len: int = 8192

    def apply(self, inv_freq: np.ndarray) -> np.ndarray:
        """float32 inverse frequencies -> the scaled ones, float32, rounded as Hugging Face's
        torch code rounds them (a Python scalar divided by a tensor is the tensor's reciprocal
        times the scalar there)."""
        f32 = np.float32
        if self.kind == "none":
            return inv_freq
        factor = f32(self.factor)
        if self.kind == "linear":
            return inv_freq / factor
        wavelen = (f32(1.0) / inv_freq) * f32(2 * math.pi)
        low_wavelen = self.original_max_len / self.low_freq_factor
        high_wavelen = self.original_max_len / self.high_freq_factor
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = ((f32(1.0) / wavelen) * f32(self.original_max_len) - f32(self.low_freq_factor)) \
            / f32(self.high_freq_factor - self.low_freq_factor)
        smoothed = (f32(1.0) - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(f32)


NO_SCALING = RotaryScaling()


def rotary_frequencies(
    dims: int, base: float, scaling: RotaryScaling | None = None
) -> np.ndarray:
    """The [dims // 2] float32 inverse frequencies of ``dims`` rotating dimensions:
    ``1 / base**(2i / dims)``, then ``scaling``."""
    exponents = np.arange(0, dims, 2).astype(np.float32) / np.float32(dims)
    inv_freq = np.float32(1.0) / (np.float32(base) ** exponents)
    return (scaling or NO_SCALING).apply(inv_freq)


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


def rotation(positions: jax.Array, frequencies: np.ndarray | jax.Array
             ) -> tuple[jax.Array, jax.Array]:
    """The sines and cosines [B, L, 1, R/2] (float32) of each token's rotary angles,
    ``position * frequencies[i]`` for the [R/2] ``frequencies`` (``rotary_frequencies``);
    positions [1, L] that every row shares give [1, L, 1, R/2], which ``rotate`` broadcasts
    (a layer then reads one row's angles, not the batch's).

    They carry the checkpoint name ``remat.ROTATION``, which every remat policy saves: in a
    scanned stack they depend on nothing a layer computes, so JAX computes them once outside
    the layers' loops and the backward pass reads them instead of evaluating sin and cos again
    in every layer (on a v5e, 1 % of a 470M model's step).
    """
    angle = positions.astype(jnp.float32)[:, :, None, None] * jnp.asarray(frequencies)
    return (checkpoint_name(jnp.sin(angle), remat.ROTATION),
            checkpoint_name(jnp.cos(angle), remat.ROTATION))


def rotate(x: jax.Array, sin: jax.Array, cos: jax.Array) -> jax.Array:
    """Rotate ``x`` [B, L, N, H] by a ``rotation``'s ``sin`` and ``cos`` [B or 1, L, 1, R/2],
    rotate-half convention: dimension i of the first R/2 pairs with dimension i of the next
    R/2; dimensions R.. pass through (partial rotary). Computed in float32 and returned in
    ``x``'s dtype."""
    rotating = 2 * sin.shape[-1]
    y = x.astype(jnp.float32)
    first, second = jnp.split(y[..., :rotating], 2, axis=-1)
    rotated = [first * cos - second * sin, second * cos + first * sin]
    if rotating < x.shape[-1]:
        rotated.append(y[..., rotating:])
    return jnp.concatenate(rotated, axis=-1).astype(x.dtype)


def apply_rotary(
    x: jax.Array, positions: jax.Array, base: float = 10000.0,
    frequencies: np.ndarray | jax.Array | None = None,
) -> jax.Array:
    """Rotate ``x`` [B, L, N, H] by its positions [B, L]: ``rotate`` by their ``rotation``.

    ``frequencies`` [R/2] rotate the first R dimensions of each head (R even, at most H);
    None: ``rotary_frequencies(H, base)``, every dimension.
    """
    if frequencies is None:
        frequencies = rotary_frequencies(x.shape[-1], base)
    return rotate(x, *rotation(positions, frequencies))


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
