"""One pre-norm transformer block: x + attention(norm(x)), then x + ffn(norm(x)).

``BlockConfig`` carries the resolved settings a block needs, so that the stack and the scan can
pass one hashable value instead of a dozen fields.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax

from pax_core import axes
from pax_transformer.layers.attention import Attention
from pax_transformer.layers.feedforward import FeedForward
from pax_transformer.layers.initializers import dense_init
from pax_transformer.layers.normalization import Norm

ACTIVATION_AXES = (axes.BATCH, axes.LENGTH, axes.EMBED)


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    """A transformer block's settings, with derived values (heads, dims) already resolved.

    ``causal`` False lets every position attend to every other (an encoder's blocks: ViT).
    ``fp8_amax_history`` > 0 runs the attention and feed-forward projections in FP8 with
    delayed scaling over that many steps (0: in ``dtype``)."""

    hidden_dims: int
    num_heads: int
    num_kv_heads: int
    dim_per_head: int
    activation: str
    gated: bool
    norm: str
    norm_epsilon: float
    rotary: bool
    rotary_base: float
    max_seq_len: int
    attention_logit_cap: float
    use_bias: bool
    dropout_rate: float
    init_std: float | None
    dtype: Any
    param_dtype: Any
    causal: bool = True
    fp8_amax_history: int = 0


def block_weights(c: BlockConfig, model_dims: int) -> int:
    """The number of weights of one block with settings ``c`` over ``model_dims``-wide
    activations (its two norms, attention and feed-forward), from the layers' layout (no
    tracing)."""
    d, f, bias = model_dims, c.hidden_dims, int(c.use_bias)
    heads, kv_heads, head_dims = c.num_heads, c.num_kv_heads, c.dim_per_head
    norm = 2 * d if c.norm == "layernorm" else d
    attention = (d + bias) * (heads + 2 * kv_heads) * head_dims + (heads * head_dims + bias) * d
    ffn = (2 if c.gated else 1) * (d + bias) * f + (f + bias) * d
    return 2 * norm + attention + ffn


class TransformerBlock(nn.Module):
    """Pre-norm attention and feed-forward with residuals; dropout on each residual branch.

    Returns ``(x, None)``, the (carry, output) shape that ``nn.scan`` expects, so that the same
    class serves both the looped and the scanned stack.
    """

    config: BlockConfig
    train: bool = False
    decode: bool = False

    def _norm(self, name: str) -> Norm:
        c = self.config
        return Norm(c.norm, c.norm_epsilon, c.dtype, c.param_dtype, name=name)

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        segment_ids: jax.Array | None,
        decode_start: jax.Array | None,
    ) -> tuple[jax.Array, None]:
        c = self.config
        init = dense_init(c.init_std)
        dropout = nn.Dropout(c.dropout_rate, deterministic=not self.train)
        h = Attention(
            num_heads=c.num_heads,
            num_kv_heads=c.num_kv_heads,
            dim_per_head=c.dim_per_head,
            kernel_init=init,
            use_bias=c.use_bias,
            logit_cap=c.attention_logit_cap,
            rotary=c.rotary,
            rotary_base=c.rotary_base,
            max_seq_len=c.max_seq_len,
            causal=c.causal,
            decode=self.decode,
            dtype=c.dtype,
            param_dtype=c.param_dtype,
            fp8_amax_history=c.fp8_amax_history,
            name="attention",
        )(self._norm("attention_norm")(x), positions, segment_ids, decode_start)
        x = nn.with_logical_constraint(x + dropout(h), ACTIVATION_AXES)
        h = FeedForward(
            hidden_dims=c.hidden_dims,
            kernel_init=init,
            activation=c.activation,
            gated=c.gated,
            use_bias=c.use_bias,
            dtype=c.dtype,
            param_dtype=c.param_dtype,
            fp8_amax_history=c.fp8_amax_history,
            name="ffn",
        )(self._norm("ffn_norm")(x))
        x = nn.with_logical_constraint(x + dropout(h), ACTIVATION_AXES)
        return x, None
