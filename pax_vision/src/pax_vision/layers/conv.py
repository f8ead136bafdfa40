"""Convolutions and dense layers whose weights and outputs carry logical axis names.

Output channels are ``axes.CHANNELS`` (split over ``mdl`` by the default rules), activations
``[BATCH, None, None, CHANNELS]``; spatial dimensions are never split.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from pax_core import axes

FEATURE_MAP_AXES = (axes.BATCH, None, None, axes.CHANNELS)

# Pax's ResNet convolution init (GaussianSqrtFanOut(sqrt(2))): N(0, 2 / (k * k * out)).
FAN_OUT_INIT = nn.initializers.variance_scaling(2.0, "fan_out", "normal")
# Pax's default init for its other layers (Xavier).
XAVIER_INIT = nn.initializers.xavier_uniform()


def conv(features: int, kernel: int, strides: int = 1, *, use_bias: bool = False,
         init: Any = FAN_OUT_INIT, dtype: Any = jnp.float32, name: str | None = None
         ) -> nn.Conv:
    """A ``kernel x kernel`` convolution with SAME padding and named weights."""
    return nn.Conv(features, (kernel, kernel), (strides, strides), padding="SAME",
                   use_bias=use_bias, dtype=dtype, name=name,
                   kernel_init=nn.with_logical_partitioning(init, (None, None, None,
                                                                   axes.CHANNELS)),
                   bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                          (axes.CHANNELS,)))


def feature_map(x: jax.Array) -> jax.Array:
    """``x`` constrained to the feature-map layout."""
    return nn.with_logical_constraint(x, FEATURE_MAP_AXES)


def conv_flops(height: int, width: int, kernel: int, channels_in: int, channels_out: int
               ) -> float:
    """Forward FLOPs of a convolution with ``height x width`` outputs (two per multiply-add)."""
    return 2.0 * height * width * kernel * kernel * channels_in * channels_out
