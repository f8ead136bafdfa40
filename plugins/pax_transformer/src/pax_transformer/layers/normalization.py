"""Pre-norm layers: LayerNorm (scale and bias) and RMSNorm (scale only).

Our own rather than flax's so that the statistics are always taken in float32 whatever the
compute dtype (bf16 means and variances lose too much), and the weights carry the logical axis
name ``"embed"`` so that the partitioner shards them like the activations they scale.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from pax_core import axes
from pax_transformer.layers.initializers import partitioned
from pax_transformer.layers.validation import check_choice

NORMS = ("layernorm", "rmsnorm")


class Norm(nn.Module):
    """LayerNorm (``kind="layernorm"``) or RMSNorm (``kind="rmsnorm"``) over the last axis."""

    kind: str = "layernorm"
    epsilon: float = 1e-6
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        check_choice("norm", self.kind, NORMS)
        dims = x.shape[-1]
        y = x.astype(jnp.float32)
        if self.kind == "layernorm":
            y = y - jnp.mean(y, axis=-1, keepdims=True)
        y = y * jax.lax.rsqrt(jnp.mean(jnp.square(y), axis=-1, keepdims=True) + self.epsilon)
        scale = self.param(
            "scale", partitioned(nn.initializers.ones, (axes.EMBED,)), (dims,), self.param_dtype
        )
        y = y * scale.astype(jnp.float32)
        if self.kind == "layernorm":
            bias = self.param(
                "bias", partitioned(nn.initializers.zeros, (axes.EMBED,)), (dims,), self.param_dtype
            )
            y = y + bias.astype(jnp.float32)
        return y.astype(self.dtype)
