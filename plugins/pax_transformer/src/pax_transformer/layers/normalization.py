"""Norms: LayerNorm (scale and bias) and RMSNorm (scale only) for pre-norm blocks, and a batch
norm with an optional mask for convolutional and audio models.

Our own rather than flax's so that the statistics are always taken in float32 whatever the
compute dtype (bf16 means and variances lose too much), and the weights carry logical axis names
so that the partitioner shards them like the activations they scale. The batch norm's
statistics go through ``pax_core.mean_across_shards``: under the SPMD partitioner a step sees
the global batch, and under the data-parallel one each device's sums are averaged across the
devices, so both normalise by the statistics of the whole batch (Pax's synchronised batch norm:
the same numbers on one device as on eight). With a mask (the valid frames of padded
utterances) only the valid positions count: each shard contributes its masked sums divided by
its own element count, the same on every shard, so the ratio of the averages is the ratio of
the global sums.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from pax_core import axes, mean_across_shards
from pax_transformer.layers.initializers import partitioned
from pax_transformer.layers.validation import check_choice

NORMS = ("layernorm", "rmsnorm")


class Norm(nn.Module):
    """LayerNorm (``kind="layernorm"``) or RMSNorm (``kind="rmsnorm"``) over the last axis.

    The normalised values are multiplied by ``scale_offset + scale``: Gemma stores its scales
    as ``scale - 1`` (offset 1.0), and a scale starts at ``1 - scale_offset`` so that a fresh
    norm multiplies by one whatever the offset. ``axis_name`` is the logical name of the
    normalised axis (the weights'): "embed" for the activations, "kv" for a head's queries or
    keys.
    """

    kind: str = "layernorm"
    epsilon: float = 1e-6
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    scale_offset: float = 0.0
    axis_name: str = axes.EMBED

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        check_choice("norm", self.kind, NORMS)
        dims = x.shape[-1]
        y = x.astype(jnp.float32)
        if self.kind == "layernorm":
            y = y - jnp.mean(y, axis=-1, keepdims=True)
        y = y * jax.lax.rsqrt(jnp.mean(jnp.square(y), axis=-1, keepdims=True) + self.epsilon)
        names = (self.axis_name,)
        scale_init = (nn.initializers.constant(1.0 - self.scale_offset) if self.scale_offset
                      else nn.initializers.ones)
        scale = self.param("scale", partitioned(scale_init, names), (dims,), self.param_dtype)
        scale = scale.astype(jnp.float32)
        if self.scale_offset:
            scale = self.scale_offset + scale
        y = y * scale
        if self.kind == "layernorm":
            bias = self.param(
                "bias", partitioned(nn.initializers.zeros, names), (dims,), self.param_dtype
            )
            y = y + bias.astype(jnp.float32)
        return y.astype(self.dtype)


def _vector(fill: Any, size: int) -> jax.Array:
    return fill((size,), jnp.float32)


class BatchNorm(nn.Module):
    """Normalise the last axis by the batch's statistics in training (updating their moving
    averages in ``batch_stats`` at ``momentum``: Pax's 0.9 for images) and by the moving
    averages in evaluation. ``mask`` (the shape of ``x`` without its last axis) leaves the
    positions where it is 0 out of the statistics. ``zero_scale`` starts the scale at 0, which
    makes a residual block start as the identity (Goyal et al.'s zero-init residual); without
    ``affine`` it only standardises (the global normalisation of features).
    ``channel_axis`` is the channels' logical axis name."""

    momentum: float = 0.9
    epsilon: float = 1e-3
    zero_scale: bool = False
    affine: bool = True
    channel_axis: str = axes.CHANNELS
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool, mask: jax.Array | None = None) -> jax.Array:
        size = x.shape[-1]
        channels = nn.with_logical_partitioning(_vector, (self.channel_axis,))
        moving_mean = self.variable("batch_stats", "mean", channels, jnp.zeros, size)
        moving_var = self.variable("batch_stats", "var", channels, jnp.ones, size)
        y = x.astype(jnp.float32)
        if train:
            mean, var = self._statistics(y, mask)
            if not self.is_initializing():
                keep = self.momentum
                moving_mean.value = keep * moving_mean.value + (1 - keep) * mean
                moving_var.value = keep * moving_var.value + (1 - keep) * var
        else:
            mean, var = moving_mean.value, moving_var.value
        y = (y - mean) * jax.lax.rsqrt(var + self.epsilon)
        if self.affine:
            scale_init = nn.initializers.zeros if self.zero_scale else nn.initializers.ones
            scale = self.param("scale", nn.with_logical_partitioning(
                scale_init, (self.channel_axis,)), (size,), jnp.float32)
            bias = self.param("bias", nn.with_logical_partitioning(
                nn.initializers.zeros, (self.channel_axis,)), (size,), jnp.float32)
            y = y * scale + bias
        return y.astype(self.dtype)

    @staticmethod
    def _statistics(y: jax.Array, mask: jax.Array | None) -> tuple[jax.Array, jax.Array]:
        """Mean and variance per channel over the whole (valid part of the) global batch."""
        reduce = tuple(range(y.ndim - 1))
        if mask is None:
            mean, mean_square = mean_across_shards(
                (jnp.mean(y, axis=reduce), jnp.mean(jnp.square(y), axis=reduce)))
            return mean, jnp.maximum(mean_square - jnp.square(mean), 0.0)
        m = mask.astype(jnp.float32)[..., None]
        elements = m.size
        total, square, count = mean_across_shards(
            (jnp.sum(y * m, axis=reduce) / elements,
             jnp.sum(jnp.square(y) * m, axis=reduce) / elements, jnp.sum(m) / elements))
        mean = total / jnp.maximum(count, 1e-9)
        return mean, jnp.maximum(square / jnp.maximum(count, 1e-9) - jnp.square(mean), 0.0)
