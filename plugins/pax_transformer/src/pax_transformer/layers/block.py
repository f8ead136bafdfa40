"""One pre-norm transformer block: x + attention(norm(x)), then x + ffn(norm(x)).

``BlockConfig`` carries the resolved settings a block needs, so that the stack and the scan can
pass one hashable value instead of a dozen fields. Its attention and feed-forward are parts
(``layers/parts.py``): templates the block completes with these settings, pax-transformer's
``Attention`` and ``FeedForward`` unless the config names others; the block's weight count and
FLOPs are its parts' own.
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
from pax_transformer.layers.parts import build_part

ACTIVATION_AXES = (axes.BATCH, axes.LENGTH, axes.EMBED)


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    """A transformer block's settings, with derived values (heads, dims) already resolved.

    ``causal`` False lets every position attend to every other (an encoder's blocks: ViT).
    ``fp8_amax_history`` > 0 runs the attention and feed-forward projections in FP8 with
    delayed scaling over that many steps (0: in ``dtype``). ``attention`` and ``feed_forward``
    are the parts' templates (None: ``Attention`` and ``FeedForward``)."""

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
    attention: Any = None
    feed_forward: Any = None

    def attention_part(self, decode: bool = False, **kwargs: Any) -> nn.Module:
        """The attention part, completed with these settings (``kwargs``: its name)."""
        given = {"num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads,
                 "dim_per_head": self.dim_per_head, "kernel_init": dense_init(self.init_std),
                 "use_bias": self.use_bias, "logit_cap": self.attention_logit_cap,
                 "rotary": self.rotary, "rotary_base": self.rotary_base,
                 "max_seq_len": self.max_seq_len, "causal": self.causal, "decode": decode,
                 "dtype": self.dtype, "param_dtype": self.param_dtype,
                 "fp8_amax_history": self.fp8_amax_history}
        return build_part(self.attention or Attention, given, **kwargs)

    def feed_forward_part(self, **kwargs: Any) -> nn.Module:
        """The feed-forward part, completed with these settings (``kwargs``: its name)."""
        given = {"hidden_dims": self.hidden_dims, "kernel_init": dense_init(self.init_std),
                 "activation": self.activation, "gated": self.gated, "use_bias": self.use_bias,
                 "dtype": self.dtype, "param_dtype": self.param_dtype,
                 "fp8_amax_history": self.fp8_amax_history}
        return build_part(self.feed_forward or FeedForward, given, **kwargs)

    def norm_weights(self, model_dims: int) -> int:
        """The weights of one of the block's norms."""
        return 2 * model_dims if self.norm == "layernorm" else model_dims


def block_weights(c: BlockConfig, model_dims: int) -> int:
    """The number of weights of one block with settings ``c`` over ``model_dims``-wide
    activations: its two norms and its parts' (no tracing)."""
    return (2 * c.norm_weights(model_dims) + c.attention_part().num_weights(model_dims)
            + c.feed_forward_part().num_weights(model_dims))


def block_train_flops_per_token(c: BlockConfig, model_dims: int, seq_len: int) -> float:
    """Training FLOPs one token costs in a block: 6 per norm weight, and its parts' own."""
    return (6.0 * 2 * c.norm_weights(model_dims)
            + c.attention_part().train_flops_per_token(model_dims, seq_len)
            + c.feed_forward_part().train_flops_per_token(model_dims, seq_len))


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
        dropout = nn.Dropout(c.dropout_rate, deterministic=not self.train)
        h = c.attention_part(self.decode, name="attention")(
            self._norm("attention_norm")(x), positions, segment_ids, decode_start)
        x = nn.with_logical_constraint(x + dropout(h), ACTIVATION_AXES)
        h = c.feed_forward_part(name="ffn")(self._norm("ffn_norm")(x))
        x = nn.with_logical_constraint(x + dropout(h), ACTIVATION_AXES)
        return x, None
