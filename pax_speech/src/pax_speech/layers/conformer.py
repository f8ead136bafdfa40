"""The Conformer encoder (Gulati et al. 2020): 4x convolutional subsampling, then blocks of
macaron feed-forward, self-attention, a depthwise-convolution module and a second feed-forward.

Attention and feed-forward are pax-transformer's layers: rotary positions on the queries and
keys (the design allows relative or rotary; rotary needs no extra weights and keeps the
attention on ``jax.nn.dot_product_attention``), and padding by segment ids (valid frames are
segment 1, padding segment 0), so a valid frame never attends to padding. The convolution
module zeroes padding before its depthwise convolution and its norm counts valid frames only.
Activations are named ``(batch, length, embed)`` for the partitioner.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from pax_core import axes
from pax_speech.layers.norm import time_norm
from pax_transformer import Attention, FeedForward, Norm, Projection, dense_init

ACTIVATION_AXES = (axes.BATCH, axes.LENGTH, axes.EMBED)
SUBSAMPLING = 4


def subsampled_lengths(lengths: jax.Array) -> jax.Array:
    """Valid frames after the two stride-2 convolutions (each gives ceil(T / 2) frames)."""
    return (lengths + 3) // 4


@dataclasses.dataclass(frozen=True)
class ConformerConfig:
    """The encoder's sizes: ``model_dims`` wide, ``num_layers`` blocks of ``num_heads``
    attention heads, feed-forward ``ffn_dims`` (4x the width in the paper), a depthwise
    kernel of ``conv_kernel`` frames normalised by ``conv_norm`` (``batchnorm`` or
    ``groupnorm``), ``subsampling_channels`` in the two subsampling convolutions."""

    model_dims: int = 256
    num_layers: int = 16
    num_heads: int = 4
    ffn_dims: int = 1024
    conv_kernel: int = 32
    conv_norm: str = "batchnorm"
    subsampling_channels: int = 256
    dropout_rate: float = 0.1
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def forward_flops_per_frame(self, frames: int, mel_bins: int) -> float:
        """Matmul FLOPs per output frame of the encoder over ``frames`` output frames (the
        attention's quadratic part) and ``mel_bins`` input bins: subsampling convolutions,
        projection, and every block's two feed-forwards, attention and convolution module."""
        d, f, c, k = self.model_dims, self.ffn_dims, self.subsampling_channels, self.conv_kernel
        first = 2 * 9 * c * 4  # conv 1 runs at 4 positions (2x time, 2x frequency) per output
        second = 2 * 9 * c * c
        projection = 2 * c * ((mel_bins + 3) // 4) * d
        subsampling = (first + second) * ((mel_bins + 3) // 4) + projection
        ffn = 2 * (2 * 2 * d * f)
        attention = 2 * 4 * d * d + 2 * 2 * frames * d
        conv = 2 * d * 2 * d + 2 * k * d + 2 * d * d
        return subsampling + self.num_layers * (ffn + attention + conv)


class Subsampling(nn.Module):
    """Two 3x3 stride-2 convolutions with ReLU over (time, mel bins), then a projection to
    the model's width: ``[B, T, F]`` features to ``[B, ceil(T/4), d]``."""

    config: ConformerConfig

    @nn.compact
    def __call__(self, features: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
        c = self.config
        x = features[..., None].astype(c.dtype)
        for i in range(2):
            # Explicit padding: SAME's would shift by a frame between odd and even lengths,
            # so the same utterance would be convolved differently in two batches.
            x = nn.Conv(c.subsampling_channels, (3, 3), strides=(2, 2),
                        padding=((1, 1), (1, 1)),
                        dtype=c.dtype, param_dtype=c.param_dtype, name=f"conv_{i}",
                        kernel_init=nn.with_logical_partitioning(
                            nn.initializers.lecun_normal(), (None, None, None, axes.CHANNELS)),
                        bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                               (axes.CHANNELS,)))(x)
            mask = mask[:, ::2]
            x = nn.relu(x) * mask[:, :, None, None].astype(x.dtype)
        batch, frames = x.shape[:2]
        x = x.reshape(batch, frames, -1)
        x = Projection((c.model_dims,), (None,), (axes.EMBED,), dense_init(None), True, c.dtype,
                       c.param_dtype, name="projection")(x)
        return nn.with_logical_constraint(x, ACTIVATION_AXES), mask


class ConvModule(nn.Module):
    """Pointwise convolution to 2d, GLU, depthwise convolution over time, norm, Swish,
    pointwise convolution back to d (the norm and residual are the block's). Inside, the
    channels are named ``mlp``, as a feed-forward's hidden units are."""

    config: ConformerConfig
    train: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        c, d = self.config, self.config.model_dims
        init = dense_init(None)
        h = Projection((2 * d,), (axes.EMBED,), (axes.MLP,), init, True, c.dtype, c.param_dtype,
                       name="pointwise_in")(x)
        h = nn.glu(h, axis=-1) * mask[..., None].astype(h.dtype)
        # No bias: the norm after it subtracts the mean (and adds its own bias).
        h = nn.Conv(d, (c.conv_kernel,), padding="SAME", feature_group_count=d, use_bias=False,
                    dtype=c.dtype, param_dtype=c.param_dtype, name="depthwise",
                    kernel_init=nn.with_logical_partitioning(nn.initializers.lecun_normal(),
                                                             (None, None, axes.MLP)))(h)
        h = nn.silu(time_norm(c.conv_norm, axes.MLP, c.dtype, "norm")(h, self.train, mask))
        return Projection((d,), (axes.MLP,), (axes.EMBED,), init, True, c.dtype,
                          c.param_dtype, name="pointwise_out")(h)


class ConformerBlock(nn.Module):
    """x + FFN/2, x + attention, x + convolution, x + FFN/2, then a final LayerNorm; each
    branch pre-normed and followed by dropout."""

    config: ConformerConfig
    train: bool = False

    def _norm(self, name: str) -> Norm:
        return Norm("layernorm", 1e-6, self.config.dtype, self.config.param_dtype, name=name)

    def _ffn(self, name: str) -> FeedForward:
        c = self.config
        return FeedForward(c.ffn_dims, dense_init(None), "silu", use_bias=True, dtype=c.dtype,
                           param_dtype=c.param_dtype, name=name)

    @nn.compact
    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        c = self.config
        dropout = nn.Dropout(c.dropout_rate, deterministic=not self.train)
        segments = mask.astype(jnp.int32)
        positions = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
        x = x + 0.5 * dropout(self._ffn("ffn_start")(self._norm("ffn_start_norm")(x)))
        heads = c.model_dims // c.num_heads
        h = Attention(c.num_heads, c.num_heads, heads, dense_init(None), use_bias=True,
                      rotary=True, max_seq_len=x.shape[1], causal=False, dtype=c.dtype,
                      param_dtype=c.param_dtype, name="attention")(
            self._norm("attention_norm")(x), positions, segments)
        x = nn.with_logical_constraint(x + dropout(h), ACTIVATION_AXES)
        h = ConvModule(c, self.train, name="conv")(self._norm("conv_norm")(x), mask)
        x = nn.with_logical_constraint(x + dropout(h), ACTIVATION_AXES)
        x = x + 0.5 * dropout(self._ffn("ffn_end")(self._norm("ffn_end_norm")(x)))
        return nn.with_logical_constraint(self._norm("out_norm")(x), ACTIVATION_AXES)


class ConformerEncoder(nn.Module):
    """Features ``[B, T, F]`` with their valid-frame mask to encodings ``[B, ceil(T/4), d]``
    and the subsampled mask."""

    config: ConformerConfig
    train: bool = False

    @nn.compact
    def __call__(self, features: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
        c = self.config
        x, mask = Subsampling(c, name="subsampling")(features, mask)
        x = nn.Dropout(c.dropout_rate, deterministic=not self.train)(x)
        for i in range(c.num_layers):
            x = ConformerBlock(c, self.train, name=f"layer_{i}")(x, mask)
        return x, mask
