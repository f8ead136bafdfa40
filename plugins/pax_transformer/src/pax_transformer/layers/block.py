"""One pre-norm transformer block: x + attention(norm(x)), then x + ffn(norm(x)).

Or, with ``parallel_residual``, ``x + attention(norm(x)) + ffn(norm'(x))`` (GPT-NeoX; one
shared norm with ``shared_norm``: Phi, GPT-J), and with ``post_norms`` each branch's output
normalised before it is added (Gemma 2 and 3).

``BlockConfig`` carries the resolved settings a block needs, so that the stack and the scan can
pass one hashable value instead of a dozen fields. Its attention and feed-forward are parts
(``layers/parts.py``): templates the block completes with these settings, pax-transformer's
``Attention`` and ``FeedForward`` unless the config names others; the block's weight count and
FLOPs are its norms' and its parts' own.
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
from pax_transformer.layers.lora import Lora
from pax_transformer.layers.normalization import Norm
from pax_transformer.layers.parts import PartStats, active_weights, build_part, part_output
from pax_transformer.layers.positions import NO_SCALING, RotaryScaling

ACTIVATION_AXES = (axes.BATCH, axes.LENGTH, axes.EMBED)


@dataclasses.dataclass(frozen=True)
class BlockConfig:
    """A transformer block's settings, with derived values (heads, dims) already resolved.

    ``causal`` False lets every position attend to every other (an encoder's blocks: ViT).
    ``fp8_amax_history`` > 0 runs the attention and feed-forward projections in FP8 with
    delayed scaling over that many steps (0: in ``dtype``). ``attention`` and ``feed_forward``
    are the parts' templates (None: ``Attention`` and ``FeedForward``). The fields after them
    are ``TransformerLm``'s of the same names (its docstring says what each does), except
    ``rotary_scaling``: a ``RotaryScaling`` holding its ``rotary_scaling`` and that kind's four
    parameters, and ``lora``: a ``Lora`` holding its four ``lora_*`` settings (None: no
    adapters). Their defaults are the plain pre-norm block.

    With ``moe_every`` > 1 or ``first_dense_layers`` > 0 the feed-forwards differ: layer i
    takes ``feed_forward`` when it is a sparse layer (``is_sparse``: past the first
    ``first_dense_layers``, every ``moe_every``-th; GLaM: every other one, DeepSeek: all but
    the first), ``FeedForward`` otherwise; ``layer_config(i)`` is layer i's config.

    With ``global_every`` > 0 the layers differ (sliding or global attention, their rotary
    frequencies), so the stack calls each block with its layer index and the block hands it to
    its attention part as ``layer``; an attention part of one's own then takes that argument.
    """

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
    qkv_bias: bool = False
    qk_norm: bool = False
    norm_scale_offset: float = 0.0
    post_norms: bool = False
    parallel_residual: bool = False
    shared_norm: bool = False
    query_scale: float | None = None
    rotary_fraction: float = 1.0
    rotary_scaling: RotaryScaling = NO_SCALING
    sliding_window: int = 0
    global_every: int = 0
    local_rotary_base: float | None = None
    per_dim_scale: bool = False
    ffn_bias: bool | None = None
    lora: Lora | None = None
    moe_every: int = 1
    first_dense_layers: int = 0

    def attention_part(self, decode: bool = False, train: bool = False, **kwargs: Any
                       ) -> nn.Module:
        """The attention part, completed with these settings (``kwargs``: its name)."""
        given = {"num_heads": self.num_heads, "num_kv_heads": self.num_kv_heads,
                 "dim_per_head": self.dim_per_head, "kernel_init": dense_init(self.init_std),
                 "use_bias": self.use_bias, "logit_cap": self.attention_logit_cap,
                 "rotary": self.rotary, "rotary_base": self.rotary_base,
                 "max_seq_len": self.max_seq_len, "causal": self.causal, "decode": decode,
                 "dtype": self.dtype, "param_dtype": self.param_dtype,
                 "fp8_amax_history": self.fp8_amax_history, "qkv_bias": self.qkv_bias,
                 "qk_norm": self.qk_norm, "norm": self.norm, "norm_epsilon": self.norm_epsilon,
                 "norm_scale_offset": self.norm_scale_offset, "query_scale": self.query_scale,
                 "rotary_fraction": self.rotary_fraction, "rotary_scaling": self.rotary_scaling,
                 "sliding_window": self.sliding_window, "global_every": self.global_every,
                 "local_rotary_base": self.local_rotary_base,
                 "per_dim_scale": self.per_dim_scale, "lora": self.lora, "train": train}
        return build_part(self.attention or Attention, given, **kwargs)

    def feed_forward_part(self, train: bool = False, **kwargs: Any) -> nn.Module:
        """The feed-forward part, completed with these settings (``kwargs``: its name)."""
        given = {"hidden_dims": self.hidden_dims, "kernel_init": dense_init(self.init_std),
                 "activation": self.activation, "gated": self.gated,
                 "use_bias": self.use_bias if self.ffn_bias is None else self.ffn_bias,
                 "dtype": self.dtype, "param_dtype": self.param_dtype,
                 "fp8_amax_history": self.fp8_amax_history, "lora": self.lora, "train": train}
        return build_part(self.feed_forward or FeedForward, given, **kwargs)

    @property
    def alternates(self) -> bool:
        """Whether some layers take ``FeedForward`` in place of ``feed_forward``."""
        return self.moe_every > 1 or self.first_dense_layers > 0

    def is_sparse(self, layer: int) -> bool:
        """Whether layer ``layer`` (from 0) takes ``feed_forward``."""
        past = layer - self.first_dense_layers
        return past >= 0 and (past + 1) % self.moe_every == 0

    def layer_config(self, layer: int) -> BlockConfig:
        """Layer ``layer``'s settings: these, or with the dense ``FeedForward``."""
        if not self.alternates or self.is_sparse(layer):
            return self
        return dataclasses.replace(self, feed_forward=None, moe_every=1, first_dense_layers=0)

    def norm_weights(self, model_dims: int) -> int:
        """The weights of one of the block's norms."""
        return 2 * model_dims if self.norm == "layernorm" else model_dims

    @property
    def block_norms(self) -> int:
        """How many norms a block holds: before attention, before the feed-forward unless the
        two branches share one, and after each branch with ``post_norms``."""
        before = 1 if self.parallel_residual and self.shared_norm else 2
        return before + (2 if self.post_norms else 0)


def block_weights(c: BlockConfig, model_dims: int) -> int:
    """The number of weights of one block with settings ``c`` over ``model_dims``-wide
    activations: its norms' and its parts' (no tracing)."""
    return (c.block_norms * c.norm_weights(model_dims)
            + c.attention_part().num_weights(model_dims)
            + c.feed_forward_part().num_weights(model_dims))


def block_active_weights(c: BlockConfig, model_dims: int) -> int:
    """The weights one token multiplies in a block with settings ``c``: all of them but a
    sparse feed-forward's unchosen experts."""
    return (c.block_norms * c.norm_weights(model_dims)
            + c.attention_part().num_weights(model_dims)
            + active_weights(c.feed_forward_part(), model_dims))


def block_train_flops_per_token(c: BlockConfig, model_dims: int, seq_len: int) -> float:
    """Training FLOPs one token costs in a block: 6 per norm weight, and its parts' own."""
    return (6.0 * c.block_norms * c.norm_weights(model_dims)
            + c.attention_part().train_flops_per_token(model_dims, seq_len)
            + c.feed_forward_part().train_flops_per_token(model_dims, seq_len))


class TransformerBlock(nn.Module):
    """Pre-norm attention and feed-forward with residuals; dropout on each residual branch.

    Sequential (``x + attention(attention_norm(x))``, then ``x + ffn(ffn_norm(x))``) or, with
    ``parallel_residual``, both branches read the block's input (through ``attention_norm``
    alone with ``shared_norm``); ``post_norms`` normalises each branch's output
    (``post_attention_norm``, ``post_ffn_norm``) before it is added. ``layer`` is the block's
    index in the stack, which the attention needs with ``global_every`` > 0.

    Returns ``(x, stats)``, the (carry, output) shape that ``nn.scan`` expects, so that the
    same class serves both the looped and the scanned stack: ``stats`` is what a sparse
    feed-forward part reports of its routing (``layers/moe.py``; a part that returns
    ``(output, stats)``), None for a dense one.
    """

    config: BlockConfig
    train: bool = False
    decode: bool = False

    def _norm(self, name: str) -> Norm:
        c = self.config
        return Norm(c.norm, c.norm_epsilon, c.dtype, c.param_dtype, c.norm_scale_offset,
                    name=name)

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        segment_ids: jax.Array | None,
        decode_start: jax.Array | None,
        layer: int | jax.Array | None = None,
    ) -> tuple[jax.Array, PartStats | None]:
        c = self.config
        dropout = nn.Dropout(c.dropout_rate, deterministic=not self.train)
        per_layer = {"layer": layer} if c.global_every else {}
        normed = self._norm("attention_norm")(x)
        h = c.attention_part(self.decode, self.train, name="attention")(
            normed, positions, segment_ids, decode_start, **per_layer)
        if c.post_norms:
            h = self._norm("post_attention_norm")(h)
        if c.parallel_residual:
            ffn_in = normed if c.shared_norm else self._norm("ffn_norm")(x)
            h_ffn, stats = self._ffn(ffn_in)
            x = x + dropout(h) + dropout(h_ffn)
        else:
            x = nn.with_logical_constraint(x + dropout(h), ACTIVATION_AXES)
            h_ffn, stats = self._ffn(self._norm("ffn_norm")(x))
            x = x + dropout(h_ffn)
        return nn.with_logical_constraint(x, ACTIVATION_AXES), stats

    def _ffn(self, x: jax.Array) -> tuple[jax.Array, PartStats | None]:
        """The feed-forward branch, with its post norm if any, and its part's stats."""
        h, stats = part_output(self.config.feed_forward_part(self.train, name="ffn")(x))
        return (self._norm("post_ffn_norm")(h) if self.config.post_norms else h), stats
