"""Batch norm whose statistics are synchronised across the data-parallel devices.

Our own rather than flax's so that the batch statistics go through
``pax_core.mean_across_shards``: under the SPMD partitioner a step sees the global batch, and
under the data-parallel one the per-device mean and mean square are averaged across devices,
so both normalise by the statistics of the whole batch (Pax's synchronised batch norm, and the
same numbers on one device as on eight). Statistics are taken in float32.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from pax_core import axes, mean_across_shards


def _vector(fill: Any, size: int) -> jax.Array:
    return fill((size,), jnp.float32)


# A statistic per channel, sharded as the channels are.
_channels = nn.with_logical_partitioning(_vector, (axes.CHANNELS,))


class BatchNorm(nn.Module):
    """Normalise the last axis by the batch's statistics in training (updating their moving
    averages in ``batch_stats`` at ``momentum``, Pax's decay 0.9) and by the moving averages
    in evaluation. ``zero_scale`` starts the scale at 0, which makes a residual block start as
    the identity (Goyal et al.'s zero-init residual)."""

    momentum: float = 0.9
    epsilon: float = 1e-3
    zero_scale: bool = False
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        size = x.shape[-1]
        moving_mean = self.variable("batch_stats", "mean", _channels, jnp.zeros, size)
        moving_var = self.variable("batch_stats", "var", _channels, jnp.ones, size)
        y = x.astype(jnp.float32)
        if train:
            reduce = tuple(range(y.ndim - 1))
            mean, mean_square = mean_across_shards(
                (jnp.mean(y, axis=reduce), jnp.mean(jnp.square(y), axis=reduce)))
            var = jnp.maximum(mean_square - jnp.square(mean), 0.0)
            if not self.is_initializing():
                m = self.momentum
                moving_mean.value = m * moving_mean.value + (1 - m) * mean
                moving_var.value = m * moving_var.value + (1 - m) * var
        else:
            mean, var = moving_mean.value, moving_var.value
        scale_init = nn.initializers.zeros if self.zero_scale else nn.initializers.ones
        scale = self.param("scale", nn.with_logical_partitioning(scale_init, (axes.CHANNELS,)),
                           (size,), jnp.float32)
        bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros,
                                                               (axes.CHANNELS,)),
                          (size,), jnp.float32)
        y = (y - mean) * jax.lax.rsqrt(var + self.epsilon) * scale + bias
        return y.astype(self.dtype)
