"""Norms over padded time: statistics of the valid frames only.

An utterance's padding must not move the statistics (or two batches of the same utterances
padded differently would normalise them differently), so every mean here is a masked one: the
batch norm is pax-transformer's with the frames' mask (synchronised across the data-parallel
devices), the group norm this module's own.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from pax_core import UsageError, axes
from pax_transformer import BatchNorm

NORMS = ("batchnorm", "groupnorm")
SPEECH_MOMENTUM = 0.99  # the batch norms' moving averages: slower than images' 0.9


def _vector(fill: Any, size: int) -> jax.Array:
    return fill((size,), jnp.float32)


def _affine(module: nn.Module, y: jax.Array, size: int, axis: str) -> jax.Array:
    """``y * scale + bias``, both per channel, named ``axis`` as the channels are."""
    scale = module.param("scale", nn.with_logical_partitioning(nn.initializers.ones, (axis,)),
                         (size,), jnp.float32)
    bias = module.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, (axis,)),
                        (size,), jnp.float32)
    return y * scale + bias


class MaskedGroupNorm(nn.Module):
    """Group norm of ``x [B, T, C]`` per utterance: ``num_groups`` groups of channels, each
    normalised over its channels and the utterance's valid frames; no batch statistics, so
    nothing differs between training and evaluation."""

    num_groups: int = 8
    epsilon: float = 1e-5
    channel_axis: str = axes.EMBED
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool, mask: jax.Array) -> jax.Array:
        batch, length, size = x.shape
        if size % self.num_groups:
            raise UsageError(f"group norm: {size} channels do not split into "
                             f"{self.num_groups} groups; use a MODEL_DIMS divisible by "
                             f"{self.num_groups}")
        y = x.astype(jnp.float32).reshape(batch, length, self.num_groups, -1)
        m = mask.astype(jnp.float32)[:, :, None, None]
        count = jnp.maximum(jnp.sum(m, axis=(1, 3), keepdims=True) * y.shape[-1], 1.0)
        mean = jnp.sum(y * m, axis=(1, 3), keepdims=True) / count
        var = jnp.sum(jnp.square(y - mean) * m, axis=(1, 3), keepdims=True) / count
        y = ((y - mean) * jax.lax.rsqrt(var + self.epsilon)).reshape(batch, length, size)
        return _affine(self, y, size, self.channel_axis).astype(self.dtype)


def time_norm(kind: str, channel_axis: str, dtype: Any, name: str) -> nn.Module:
    """The conv module's norm by name (``NORMS``)."""
    if kind == "batchnorm":
        return BatchNorm(momentum=SPEECH_MOMENTUM, channel_axis=channel_axis, dtype=dtype,
                         name=name)
    if kind == "groupnorm":
        return MaskedGroupNorm(channel_axis=channel_axis, dtype=dtype, name=name)
    raise UsageError(f"CONV_NORM must be one of {', '.join(NORMS)}, got {kind!r}")
