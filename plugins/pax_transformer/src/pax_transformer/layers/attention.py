"""Self-attention, causal or not: multi-head, grouped-query and multi-query, with a KV cache.

Attention itself goes through ``pax_core.dot_product_attention``, which the running backend
serves (XLA's by default, Splash on TPUs, cuDNN's fused kernel on GPUs with pax-gpu), told what
the mask means (causal, packed segments, a sliding window) beside the mask itself, with the
logit cap (Pax's ``atten_logit_cap``: ``cap * tanh(logits / cap)``) and a ``query_scale`` of the
layer's own (Gemma 2's ``query_pre_attn_scalar ** -0.5``).

Masking is by slot: query slot i (offset by the cache index when decoding, each row by its
own when rows at different positions share a batch) sees key slots j <= i (every slot with
``causal=False``, an encoder's attention), and with ``segment_ids`` only keys of its own
segment. A token always sees itself, so no row is ever fully masked. With a
``sliding_window`` w a sliding layer's query sees only key slots j > i - w (the last w
positions, itself included); with ``global_every`` n, every n-th layer (``layer`` index i with
(i + 1) % n == 0) attends to every earlier position instead. The layer index is a Python int in
a looped stack and a traced scalar in a scanned one (one traced block serves every layer), so
the window and the rotary frequencies a layer uses are chosen as data there.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.typing import Initializer
from jax.ad_checkpoint import checkpoint_name

from pax_core import axes, dot_product_attention
from pax_transformer.layers import remat
from pax_transformer.layers.dense import Projection
from pax_transformer.layers.initializers import partitioned
from pax_transformer.layers.lora import Lora
from pax_transformer.layers.normalization import Norm
from pax_transformer.layers.positions import (
    NO_SCALING,
    RotaryScaling,
    rotary_frequencies,
    rotate,
    rotation,
)

QKV_AXES = (axes.BATCH, axes.LENGTH, axes.HEADS, axes.KV)
PATH = "attention"  # the part's name in a block: its projections' paths for LoRA targets
PROJECTIONS = tuple(f"{PATH}/{name}" for name in ("query", "key", "value", "out"))
SOFTPLUS_0_INVERSE = 1.442695041  # 1 / softplus(0) = 1 / ln 2, as praxis writes it

# Whether a layer slides: a Python bool in a looped stack, a traced boolean scalar in a scan.
Sliding = bool | jax.Array


def _query_slots(query_length: int, offset: jax.Array | int) -> jax.Array:
    """[1 or B, T, 1]: the cache slot of each query, ``offset + i``; ``offset`` is one start
    for every row (a scalar) or each row's own ([B], rows decoding at different positions)."""
    starts = jnp.reshape(jnp.asarray(offset, jnp.int32), (-1, 1, 1))
    return starts + jnp.arange(query_length, dtype=jnp.int32)[None, :, None]


def causal_mask(query_length: int, key_length: int, offset: jax.Array | int = 0) -> jax.Array:
    """[1, 1, T, S] booleans ([B, 1, T, S] for a per-row ``offset`` [B]): query i (at slot
    ``offset + i``) may see key slot j <= that slot."""
    keys = jnp.arange(key_length, dtype=jnp.int32)[None, None, :]
    return (keys <= _query_slots(query_length, offset))[:, None]


def window_mask(
    query_length: int, key_length: int, window: int, offset: jax.Array | int = 0
) -> jax.Array:
    """[1, 1, T, S] booleans ([B, 1, T, S] for a per-row ``offset`` [B]): key slot j lies in
    the ``window`` slots up to query i's slot (``offset + i``), itself included:
    j > slot - window. Later slots pass (the causal mask takes them)."""
    keys = jnp.arange(key_length, dtype=jnp.int32)[None, None, :]
    return (keys > _query_slots(query_length, offset) - window)[:, None]


def segment_mask(segment_ids: jax.Array) -> jax.Array:
    """[B, 1, L, L] booleans: query and key belong to the same packed segment."""
    return (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]


class Attention(nn.Module):
    """Pre-projected self-attention over [B, L, d] inputs.

    Weights: ``query`` kernel [d, heads, dim_per_head], ``key``/``value`` kernels
    [d, kv_heads, dim_per_head], ``out`` kernel [heads, dim_per_head, d]; with ``use_bias`` a
    bias on each, shaped like its output ([heads, dim_per_head], [kv_heads, dim_per_head], [d]);
    with ``qkv_bias`` only on the query, key and value projections (Qwen 2). ``qk_norm``
    normalises each head's queries and keys over dim_per_head after the projection and before
    rotary (Qwen 3, Gemma 3), with a ``norm`` of their own (``query_norm``, ``key_norm``: scale
    [dim_per_head] named "kv", plus a bias for layernorm) of kind ``norm``, ``norm_epsilon``
    and ``norm_scale_offset``. ``fp8_amax_history`` > 0 runs the four projections in FP8
    (``Projection``); the attention itself stays in ``dtype``.

    ``query_scale`` multiplies the query-key logits (None: 1/sqrt(dim_per_head)). Rotary turns
    the first ``int(dim_per_head * rotary_fraction)`` dimensions of each head by the
    frequencies of ``rotary_base`` stretched by ``rotary_scaling``; the rest pass through.
    ``sliding_window`` w > 0 limits a sliding layer's queries to the last w positions: every
    layer's, or with ``global_every`` n > 0 the layer with index ``layer`` (a call argument
    the stack passes) unless (layer + 1) % n == 0. The sliding layers rotate by the unscaled
    frequencies of ``local_rotary_base`` when that is set (Gemma 3). ``per_dim_scale``
    multiplies the rotated queries by ``softplus(w) / softplus(0)`` per dimension (weight
    ``per_dim_scale`` [dim_per_head] named "kv", zeros at the start), on top of
    ``query_scale``: praxis's default query scaling (``PerDimScale``).
    ``lora`` puts low-rank adapters on the projections it targets (``attention/query`` ..
    ``attention/out``), their dropout active when ``train``.

    ``decode=True`` keeps the keys and values of every position seen so far in the ``cache``
    collection as ``cached_key`` and ``cached_value`` ([B, max_seq_len, kv_heads, dim_per_head]
    each; a sliding window is the mask's business, the cache still holds every position); the
    caller passes the cache slot of the chunk's first token as ``decode_start``: an int32
    scalar when every row is at the same place, or one per row ([B]) when rows of different
    lengths share the batch (each row's keys and values are written at its own slot and its
    queries masked from there). Writing past ``max_seq_len`` is not detected inside jit (the
    update clamps), so callers keep within it.
    """

    num_heads: int
    num_kv_heads: int
    dim_per_head: int
    kernel_init: Initializer
    use_bias: bool = False
    logit_cap: float = 0.0
    rotary: bool = True
    rotary_base: float = 10000.0
    max_seq_len: int = 2048
    causal: bool = True
    decode: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    fp8_amax_history: int = 0
    qkv_bias: bool = False
    qk_norm: bool = False
    norm: str = "rmsnorm"
    norm_epsilon: float = 1e-6
    norm_scale_offset: float = 0.0
    query_scale: float | None = None
    rotary_fraction: float = 1.0
    rotary_scaling: RotaryScaling = NO_SCALING
    sliding_window: int = 0
    global_every: int = 0
    local_rotary_base: float | None = None
    per_dim_scale: bool = False
    lora: Lora | None = None
    train: bool = False

    @nn.nowrap
    def num_weights(self, model_dims: int) -> int:
        """The four projections' kernels and biases, the query and key norms' weights, the
        per-dimension query scale and the adapters."""
        d, b, h = model_dims, int(self.use_bias), self.dim_per_head
        qkv_b = int(self.use_bias or self.qkv_bias)
        qk_norms = 2 * (2 * h if self.norm == "layernorm" else h) if self.qk_norm else 0
        q, kv = self.num_heads * h, self.num_kv_heads * h
        adapters = sum(self.lora.rank * (d + width) for name, width in
                       (("query", q), ("key", kv), ("value", kv), ("out", q))
                       if self._adapter(name)) if self.lora else 0
        return (d + qkv_b) * (q + 2 * kv) + (q + b) * d + qk_norms \
            + (h if self.per_dim_scale else 0) + adapters

    @nn.nowrap
    def _adapter(self, name: str) -> Lora | None:
        """The adapter of projection ``name``, if ``lora`` targets it."""
        return self.lora if self.lora and self.lora.adapts(f"{PATH}/{name}") else None

    @nn.nowrap
    def train_flops_per_token(self, model_dims: int, seq_len: int) -> float:
        """6 per weight, plus the scores and weighted values: 12 x heads x dim_per_head x
        seq_len (PaLM's convention: neither the causal mask's saving nor a sliding window's
        is discounted)."""
        return float(6 * self.num_weights(model_dims)
                     + 12 * self.num_heads * self.dim_per_head * seq_len)

    def _projection(
        self, features: tuple[int, ...], in_names: tuple[str, ...], out_names: tuple[str, ...],
        name: str, use_bias: bool,
    ) -> Projection:
        return Projection(
            features, in_names, out_names, self.kernel_init, use_bias, self.dtype,
            self.param_dtype, self.fp8_amax_history, self._adapter(name), self.train, name=name,
        )

    def _head_norm(self, name: str) -> Norm:
        return Norm(self.norm, self.norm_epsilon, self.dtype, self.param_dtype,
                    self.norm_scale_offset, axes.KV, name=name)

    @nn.nowrap
    def sliding(self, layer: int | jax.Array | None) -> Sliding | None:
        """Whether layer ``layer`` slides: None when no layer does, else a Python bool for a
        Python int ``layer`` and a traced boolean for a traced one."""
        if not self.sliding_window:
            return None
        if not self.global_every:
            return True
        if layer is None:
            raise ValueError("global_every > 0 needs the layer's index: call the attention with "
                             "layer=<its index in the stack>")
        return (layer + 1) % self.global_every != 0

    @nn.nowrap
    def rotation(self, positions: jax.Array, sliding: Sliding | None
                 ) -> tuple[jax.Array, jax.Array]:
        """The rotary sines and cosines of a layer that slides or not (``sliding``). A traced
        ``sliding`` selects between both frequency sets' rotations, each computed from the
        positions alone, so that they stay outside a scanned stack's loops (``rotation``)."""
        dims = int(self.dim_per_head * self.rotary_fraction)
        full = rotary_frequencies(dims, self.rotary_base, self.rotary_scaling)
        if self.local_rotary_base is None or sliding is None or sliding is False:
            return rotation(positions, full)
        local = rotation(positions, rotary_frequencies(dims, self.local_rotary_base))
        if sliding is True:
            return local
        full_rotation = rotation(positions, full)
        return tuple(jnp.where(sliding, a, b) for a, b in zip(local, full_rotation, strict=True))

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        segment_ids: jax.Array | None = None,
        decode_start: jax.Array | None = None,
        layer: int | jax.Array | None = None,
    ) -> jax.Array:
        if self.sliding_window and not self.causal:
            raise ValueError("sliding_window limits causal attention only; set causal=True or "
                             "sliding_window=0")
        heads = (self.num_heads, self.dim_per_head)
        kv_heads = (self.num_kv_heads, self.dim_per_head)
        qkv_bias = self.use_bias or self.qkv_bias
        in_axes, out_axes = (axes.EMBED,), (axes.HEADS, axes.KV)
        query = self._projection(heads, in_axes, out_axes, "query", qkv_bias)(x)
        key = self._projection(kv_heads, in_axes, out_axes, "key", qkv_bias)(x)
        value = self._projection(kv_heads, in_axes, out_axes, "value", qkv_bias)(x)
        query = checkpoint_name(query, remat.QUERY_PROJ)
        key = checkpoint_name(key, remat.KEY_PROJ)
        value = checkpoint_name(value, remat.VALUE_PROJ)
        if self.qk_norm:
            query = self._head_norm("query_norm")(query)
            key = self._head_norm("key_norm")(key)
        sliding = self.sliding(layer)
        if self.rotary:
            sin, cos = self.rotation(positions, sliding)
            query, key = rotate(query, sin, cos), rotate(key, sin, cos)
        if self.per_dim_scale:
            query = self._scale_per_dim(query)
        query, key, value = (nn.with_logical_constraint(t, QKV_AXES) for t in (query, key, value))

        offset: jax.Array | int = 0
        if self.decode:
            key, value = self._update_cache(key, value, decode_start)
            offset = decode_start
            mask = causal_mask(query.shape[1], key.shape[1], decode_start)
            is_causal, segment_ids = False, None  # a cache's mask is offset: only the mask says it
        else:
            mask = causal_mask(query.shape[1], key.shape[1]) if self.causal else None
            is_causal = self.causal
            if segment_ids is not None:
                segments = segment_mask(segment_ids)
                mask = segments if mask is None else mask & segments
        window = 0
        if sliding is not None and sliding is not False:
            in_window = window_mask(query.shape[1], key.shape[1], self.sliding_window, offset)
            if sliding is True:
                window = self.sliding_window
            else:  # a scanned layer: the window applies where it slides, as data
                in_window = in_window | ~sliding
                is_causal, segment_ids = False, None  # only the mask says what it hides
            mask = in_window if mask is None else mask & in_window
        context = dot_product_attention(
            query, key, value, mask=mask, is_causal=is_causal, segment_ids=segment_ids,
            window=window if is_causal else 0, logit_cap=self.logit_cap, scale=self.query_scale)
        context = nn.with_logical_constraint(context, QKV_AXES)

        out = self._projection((x.shape[-1],), out_axes, (axes.EMBED,), "out", self.use_bias)(
            context)
        return checkpoint_name(out, remat.OUT_PROJ)

    def _scale_per_dim(self, query: jax.Array) -> jax.Array:
        """Praxis's per-dimension query scale: each of a head's dimensions multiplied by
        ``softplus(w) / softplus(0)``, w [dim_per_head] shared by the heads and starting at 0,
        so that an untrained layer attends exactly as without it."""
        weight = self.param("per_dim_scale", partitioned(nn.initializers.zeros, (axes.KV,)),
                            (self.dim_per_head,), self.param_dtype)
        factor = jax.nn.softplus(weight.astype(jnp.float32)) * SOFTPLUS_0_INVERSE
        return (query.astype(jnp.float32) * factor).astype(query.dtype)

    def _update_cache(
        self, key: jax.Array, value: jax.Array, start: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Write this chunk's keys/values at ``start`` (a scalar, or each row's own [B]);
        return the whole cache to attend to.

        During ``init`` nothing is stored, so the cache a caller gets back is all zeros.
        """
        shape = (key.shape[0], self.max_seq_len, *key.shape[2:])
        cached = [
            self.variable("cache", name, jnp.zeros, shape, self.dtype)
            for name in ("cached_key", "cached_value")
        ]
        starts = jnp.broadcast_to(jnp.asarray(start, jnp.int32), (key.shape[0],))

        def write(row: jax.Array, new: jax.Array, at: jax.Array) -> jax.Array:
            return jax.lax.dynamic_update_slice(row, new, (at, 0, 0))

        updated = [
            jax.vmap(write)(var.value, new.astype(self.dtype), starts)
            for var, new in zip(cached, (key, value), strict=True)
        ]
        if not self.is_initializing():
            for var, new in zip(cached, updated, strict=True):
                var.value = new
        return updated[0], updated[1]
