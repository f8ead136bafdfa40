"""The Vision Transformer (Dosovitskiy et al.): non-overlapping patches embedded by a strided
convolution, learned positions, pax-transformer's encoder blocks (non-causal attention,
pre-norm LayerNorm, GELU), a final norm, and the class token's output or the mean of the
patches' (``pooling``) as features."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from pax_core import axes
from pax_transformer import BlockConfig, Norm, TransformerStack, block_weights

POOLINGS = ("cls", "gap")


class VisionTransformer(nn.Module):
    """ViT features ``[B, model_dims]`` of ``[B, H, W, C]`` images (H, W multiples of
    ``patch_size``)."""

    patch_size: int = 16
    model_dims: int = 768
    num_layers: int = 12
    num_heads: int = 12
    hidden_dims: int = 3072
    pooling: str = "gap"
    dropout_rate: float = 0.0
    scan_layers: bool = False
    remat_policy: str | None = None
    dtype: Any = jnp.float32

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.model_dims % self.num_heads:
            raise ValueError(f"model_dims {self.model_dims} must divide by num_heads "
                             f"{self.num_heads}")
        super().__post_init__()

    @nn.nowrap
    def block_config(self, num_tokens: int) -> BlockConfig:
        return BlockConfig(
            hidden_dims=self.hidden_dims, num_heads=self.num_heads,
            num_kv_heads=self.num_heads, dim_per_head=self.model_dims // self.num_heads,
            activation="gelu", gated=False, norm="layernorm", norm_epsilon=1e-6, rotary=False,
            rotary_base=10000.0, max_seq_len=num_tokens, attention_logit_cap=0.0,
            use_bias=True, dropout_rate=self.dropout_rate, init_std=None,
            dtype=jnp.dtype(self.dtype), param_dtype=jnp.dtype(jnp.float32), causal=False)

    @nn.nowrap
    def num_tokens(self, height: int, width: int) -> int:
        patches = (height // self.patch_size) * (width // self.patch_size)
        return patches + (self.pooling == "cls")

    @nn.compact
    def __call__(self, x: jax.Array, train: bool = False) -> jax.Array:
        p, d = self.patch_size, self.model_dims
        if x.shape[1] % p or x.shape[2] % p:
            raise ValueError(f"ViT images must be multiples of patch_size {p}, got "
                             f"{x.shape[1]}x{x.shape[2]}")
        kernel_init = nn.initializers.variance_scaling(1.0, "fan_in", "truncated_normal")
        x = nn.Conv(d, (p, p), (p, p), padding="VALID", dtype=self.dtype, name="patches",
                    kernel_init=nn.with_logical_partitioning(kernel_init,
                                                             (None, None, None, axes.EMBED)),
                    bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                           (axes.EMBED,)))(x)
        x = x.reshape(x.shape[0], -1, d)
        if self.pooling == "cls":
            token = self.param("cls", nn.with_logical_partitioning(nn.initializers.zeros,
                                                                   (None, None, axes.EMBED)),
                               (1, 1, d), jnp.float32)
            x = jnp.concatenate([jnp.broadcast_to(token, (x.shape[0], 1, d)).astype(x.dtype),
                                 x], axis=1)
        tokens = x.shape[1]
        positions = self.param("positions", nn.with_logical_partitioning(
            nn.initializers.normal(0.02), (axes.LENGTH, axes.EMBED)), (tokens, d), jnp.float32)
        x = nn.with_logical_constraint(x + positions.astype(x.dtype),
                                       (axes.BATCH, axes.LENGTH, axes.EMBED))
        x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
        x, _ = TransformerStack(self.block_config(tokens), self.num_layers, self.scan_layers,
                                self.remat_policy, train, name="encoder")(
            x, jnp.broadcast_to(jnp.arange(tokens), x.shape[:2]))
        x = Norm("layernorm", 1e-6, self.dtype, name="final_norm")(x)
        pooled = x[:, 0] if self.pooling == "cls" else jnp.mean(x, axis=1)
        return pooled.astype(jnp.float32)

    @nn.nowrap
    def feature_dims(self) -> int:
        return self.model_dims

    @nn.nowrap
    def forward_flops(self, height: int, width: int, channels: int) -> float:
        """FLOPs of one image's forward pass: 2 per weight a token multiplies (the patch
        projection for each patch, every block for each token) plus attention's scores and
        weighted values (4 x layers x tokens^2 x model_dims)."""
        tokens = self.num_tokens(height, width)
        patches = tokens - (self.pooling == "cls")
        per_token = self.num_layers * block_weights(self.block_config(tokens), self.model_dims)
        patch_embed = self.patch_size**2 * channels * self.model_dims
        attention = 4.0 * self.num_layers * tokens * tokens * self.model_dims
        return 2.0 * (tokens * per_token + patches * patch_embed) + attention
