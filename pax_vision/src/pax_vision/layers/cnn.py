"""Pax's MNIST CNN (``tasks.vision.params.mnist``): two 3x3 convolutions of 32 and 64 channels,
each with ReLU and 2x2 average pooling, then a 256-unit dense layer with ReLU."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from pax_core import axes
from pax_vision.layers.conv import XAVIER_INIT, conv, conv_flops, feature_map


class MnistCnn(nn.Module):
    """The features of Pax's MNIST model; the classifier adds the 10-way projection."""

    channels: tuple[int, ...] = (32, 64)
    kernel_size: int = 3
    hidden_dims: int = 256
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        for i, channels in enumerate(self.channels):
            x = nn.relu(feature_map(conv(channels, self.kernel_size, use_bias=True,
                                         init=XAVIER_INIT, dtype=self.dtype,
                                         name=f"conv_{i}")(x)))
            x = nn.avg_pool(x, (2, 2), (2, 2), padding="SAME")
        x = x.reshape(x.shape[0], -1)
        dense = nn.Dense(self.hidden_dims, dtype=self.dtype, name="hidden",
                         kernel_init=nn.with_logical_partitioning(XAVIER_INIT, (None, axes.MLP)),
                         bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                                (axes.MLP,)))
        return nn.relu(dense(x))

    @nn.nowrap
    def feature_dims(self) -> int:
        return self.hidden_dims

    @nn.nowrap
    def forward_flops(self, height: int, width: int, channels: int) -> float:
        """FLOPs of one image's forward pass (convolutions and the dense layer)."""
        flops = 0.0
        for out in self.channels:
            flops += conv_flops(height, width, self.kernel_size, channels, out)
            height, width, channels = -(-height // 2), -(-width // 2), out
        return flops + 2.0 * height * width * channels * self.hidden_dims
