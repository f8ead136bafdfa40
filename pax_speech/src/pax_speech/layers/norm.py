"""Norms over padded time: statistics of the valid frames only.

An utterance's padding must not move the statistics (or two batches of the same utterances
padded differently would normalise them differently), so every mean here is a masked one.
``MaskedBatchNorm`` synchronises its statistics across the data-parallel devices through
``pax_core.mean_across_shards``, exactly: each shard contributes its masked sums divided by
its own element count, the same count on every shard, so the ratio of the averages is the ratio
of the global sums (the same numbers on one device as on eight).
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from pax_core import UsageError, axes, mean_across_shards

NORMS = ("batchnorm", "groupnorm")


def _vector(fill: Any, size: int) -> jax.Array:
    return fill((size,), jnp.float32)


def _affine(module: nn.Module, y: jax.Array, size: int, axis: str) -> jax.Array:
    """``y * scale + bias``, both per channel, named ``axis`` as the channels are."""
    scale = module.param("scale", nn.with_logical_partitioning(nn.initializers.ones, (axis,)),
                         (size,), jnp.float32)
    bias = module.param("bias", nn.with_logical_partitioning(nn.initializers.zeros, (axis,)),
                        (size,), jnp.float32)
    return y * scale + bias


class MaskedBatchNorm(nn.Module):
    """Normalise the last axis of ``x [B, T, C]`` by the statistics of the valid frames of the
    batch in training (their moving averages, at ``momentum``, in ``batch_stats``) and by the
    moving averages in evaluation. With ``affine`` False it only standardises (the global
    normalisation of features). ``channel_axis`` is the channels' logical axis name."""

    momentum: float = 0.99
    epsilon: float = 1e-3
    affine: bool = True
    channel_axis: str = axes.EMBED
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array, train: bool) -> jax.Array:
        size = x.shape[-1]
        channels = nn.with_logical_partitioning(_vector, (self.channel_axis,))
        moving_mean = self.variable("batch_stats", "mean", channels, jnp.zeros, size)
        moving_var = self.variable("batch_stats", "var", channels, jnp.ones, size)
        y = x.astype(jnp.float32)
        if train:
            m = mask.astype(jnp.float32)[..., None]
            elements = m.shape[0] * m.shape[1]
            total, square, count = mean_across_shards(
                (jnp.sum(y * m, axis=(0, 1)) / elements,
                 jnp.sum(jnp.square(y) * m, axis=(0, 1)) / elements, jnp.sum(m) / elements))
            mean = total / jnp.maximum(count, 1e-9)
            var = jnp.maximum(square / jnp.maximum(count, 1e-9) - jnp.square(mean), 0.0)
            if not self.is_initializing():
                keep = self.momentum
                moving_mean.value = keep * moving_mean.value + (1 - keep) * mean
                moving_var.value = keep * moving_var.value + (1 - keep) * var
        else:
            mean, var = moving_mean.value, moving_var.value
        y = (y - mean) * jax.lax.rsqrt(var + self.epsilon)
        if self.affine:
            y = _affine(self, y, size, self.channel_axis)
        return y.astype(self.dtype)


class MaskedGroupNorm(nn.Module):
    """Group norm of ``x [B, T, C]`` per utterance: ``num_groups`` groups of channels, each
    normalised over its channels and the utterance's valid frames; no batch statistics, so
    nothing differs between training and evaluation."""

    num_groups: int = 8
    epsilon: float = 1e-5
    channel_axis: str = axes.EMBED
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array, train: bool) -> jax.Array:
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
        return MaskedBatchNorm(channel_axis=channel_axis, dtype=dtype, name=name)
    if kind == "groupnorm":
        return MaskedGroupNorm(channel_axis=channel_axis, dtype=dtype, name=name)
    raise UsageError(f"CONV_NORM must be one of {', '.join(NORMS)}, got {kind!r}")
