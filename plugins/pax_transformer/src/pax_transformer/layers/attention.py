"""Self-attention, causal or not: multi-head, grouped-query and multi-query, with a KV cache.

Attention itself goes through ``pax_core.dot_product_attention``, which the running backend
serves (XLA's ``jax.nn.dot_product_attention`` by default, cuDNN's fused kernel on GPUs with
pax-gpu). That has no logit cap, so with ``logit_cap > 0`` (Pax's
``atten_logit_cap``: ``cap * tanh(logits / cap)``) an explicit einsum path computes the same
thing with the same mask, the same 1/sqrt(dim_per_head) scale and a float32 softmax.

Masking is by slot: query slot i (offset by the cache index when decoding) sees key slots
j <= i (every slot with ``causal=False``, an encoder's attention), and with ``segment_ids`` only
keys of its own segment. A token always sees itself, so no row is ever fully masked.
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
from pax_transformer.layers.positions import apply_rotary

QKV_AXES = (axes.BATCH, axes.LENGTH, axes.HEADS, axes.KV)


def causal_mask(query_length: int, key_length: int, offset: jax.Array | int = 0) -> jax.Array:
    """[1, 1, T, S] booleans: query i (at slot ``offset + i``) may see key slot j <= that slot."""
    query_slots = offset + jnp.arange(query_length)[:, None]
    return (jnp.arange(key_length)[None, :] <= query_slots)[None, None]


def segment_mask(segment_ids: jax.Array) -> jax.Array:
    """[B, 1, L, L] booleans: query and key belong to the same packed segment."""
    return (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]


def capped_attention(
    query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array | None, logit_cap: float
) -> jax.Array:
    """``dot_product_attention`` with ``cap * tanh(logits / cap)`` on the scaled logits.

    query [B, T, N, H], key/value [B, S, K, H] with K dividing N, mask broadcastable to
    [B, N, T, S] (None: no mask) -> [B, T, N, H]. Logits and softmax in float32.
    """
    batch, length, heads, dims = query.shape
    kv_heads = key.shape[2]
    grouped = query.reshape(batch, length, kv_heads, heads // kv_heads, dims)
    logits = jnp.einsum("btkgh,bskh->bkgts", grouped, key, preferred_element_type=jnp.float32)
    logits = logits * dims**-0.5
    logits = logit_cap * jnp.tanh(logits / logit_cap)
    if mask is not None:
        logits = jnp.where(mask[:, :, None], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
    context = jnp.einsum("bkgts,bskh->btkgh", probs, value)
    return context.reshape(batch, length, heads, dims)


def attend(
    query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array | None,
    logit_cap: float = 0.0, *, is_causal: bool = False, segment_ids: jax.Array | None = None,
) -> jax.Array:
    """Masked attention, through the running backend's ``pax_core.dot_product_attention``
    unless a logit cap is asked for; ``is_causal`` and ``segment_ids`` say how ``mask`` was
    made, so that a fused kernel can make it itself."""
    if logit_cap:
        return capped_attention(query, key, value, mask, logit_cap)
    return dot_product_attention(query, key, value, mask=mask, is_causal=is_causal,
                                 segment_ids=segment_ids)


class Attention(nn.Module):
    """Pre-projected self-attention over [B, L, d] inputs.

    Weights: ``query`` kernel [d, heads, dim_per_head], ``key``/``value`` kernels
    [d, kv_heads, dim_per_head], ``out`` kernel [heads, dim_per_head, d]; with ``use_bias`` a
    bias on each, shaped like its output ([heads, dim_per_head], [kv_heads, dim_per_head], [d]).
    ``fp8_amax_history`` > 0 runs the four projections in FP8 (``Projection``); the attention
    itself stays in ``dtype``.

    ``decode=True`` keeps the keys and values of every position seen so far in the ``cache``
    collection as ``cached_key`` and ``cached_value`` ([B, max_seq_len, kv_heads, dim_per_head]
    each); the caller passes the cache
    index of the first token of the chunk as ``decode_start``. Writing past ``max_seq_len``
    is not detected inside jit (the update clamps), so callers keep within it.
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

    @nn.nowrap
    def num_weights(self, model_dims: int) -> int:
        """The four projections' kernels and biases."""
        d, b, h = model_dims, int(self.use_bias), self.dim_per_head
        return (d + b) * (self.num_heads + 2 * self.num_kv_heads) * h + (self.num_heads * h + b) * d

    @nn.nowrap
    def train_flops_per_token(self, model_dims: int, seq_len: int) -> float:
        """6 per weight, plus the scores and weighted values: 12 x heads x dim_per_head x
        seq_len (PaLM's convention: the causal mask's saving is not discounted)."""
        return float(6 * self.num_weights(model_dims)
                     + 12 * self.num_heads * self.dim_per_head * seq_len)

    def _projection(
        self, features: tuple[int, ...], in_names: tuple[str, ...], out_names: tuple[str, ...],
        name: str,
    ) -> Projection:
        return Projection(
            features, in_names, out_names, self.kernel_init, self.use_bias, self.dtype,
            self.param_dtype, self.fp8_amax_history, name=name,
        )

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        segment_ids: jax.Array | None = None,
        decode_start: jax.Array | None = None,
    ) -> jax.Array:
        heads = (self.num_heads, self.dim_per_head)
        kv_heads = (self.num_kv_heads, self.dim_per_head)
        query = self._projection(heads, (axes.EMBED,), (axes.HEADS, axes.KV), "query")(x)
        key = self._projection(kv_heads, (axes.EMBED,), (axes.HEADS, axes.KV), "key")(x)
        value = self._projection(kv_heads, (axes.EMBED,), (axes.HEADS, axes.KV), "value")(x)
        query = checkpoint_name(query, remat.QUERY_PROJ)
        key = checkpoint_name(key, remat.KEY_PROJ)
        value = checkpoint_name(value, remat.VALUE_PROJ)
        if self.rotary:
            query = apply_rotary(query, positions, self.rotary_base)
            key = apply_rotary(key, positions, self.rotary_base)
        query, key, value = (nn.with_logical_constraint(t, QKV_AXES) for t in (query, key, value))

        if self.decode:
            key, value = self._update_cache(key, value, decode_start)
            mask = causal_mask(query.shape[1], key.shape[1], decode_start)
            is_causal, segment_ids = False, None  # a cache's mask is offset: only the mask says it
        else:
            mask = causal_mask(query.shape[1], key.shape[1]) if self.causal else None
            is_causal = self.causal
            if segment_ids is not None:
                segments = segment_mask(segment_ids)
                mask = segments if mask is None else mask & segments
        context = attend(query, key, value, mask, self.logit_cap, is_causal=is_causal,
                         segment_ids=segment_ids)
        context = checkpoint_name(nn.with_logical_constraint(context, QKV_AXES), remat.CONTEXT)

        out = self._projection((x.shape[-1],), (axes.HEADS, axes.KV), (axes.EMBED,), "out")(context)
        return checkpoint_name(out, remat.OUT_PROJ)

    def _update_cache(
        self, key: jax.Array, value: jax.Array, start: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Write this chunk's keys/values at ``start``; return the whole cache to attend to.

        During ``init`` nothing is stored, so the cache a caller gets back is all zeros.
        """
        shape = (key.shape[0], self.max_seq_len, *key.shape[2:])
        cached = [
            self.variable("cache", name, jnp.zeros, shape, self.dtype)
            for name in ("cached_key", "cached_value")
        ]
        updated = [
            jax.lax.dynamic_update_slice(var.value, new.astype(self.dtype), (0, start, 0, 0))
            for var, new in zip(cached, (key, value), strict=True)
        ]
        if not self.is_initializing():
            for var, new in zip(cached, updated, strict=True):
                var.value = new
        return updated[0], updated[1]
