"""XLA's attention written as einsums: what serves a logit cap or a scale of its own, which
``jax.nn.dot_product_attention`` has no way to say, on every platform whose kernel cannot."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def einsum_attention(query: jax.Array, key: jax.Array, value: jax.Array, mask: jax.Array | None,
                     scale: float | None = None, logit_cap: float = 0.0) -> jax.Array:
    """XLA's attention with a logit cap or a scale of its own, which
    ``jax.nn.dot_product_attention`` has no way to say: explicit einsums, the logits and the
    softmax in float32, ``mask`` applied as in ``dot_product_attention``."""
    batch, length, heads, dims = query.shape
    kv_heads = key.shape[2]
    grouped = query.reshape(batch, length, kv_heads, heads // kv_heads, dims)
    logits = jnp.einsum("btkgh,bskh->bkgts", grouped, key, preferred_element_type=jnp.float32)
    logits = logits * (dims**-0.5 if scale is None else scale)
    if logit_cap:
        logits = logit_cap * jnp.tanh(logits / logit_cap)
    if mask is not None:
        logits = jnp.where(mask[:, :, None], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(value.dtype)
    context = jnp.einsum("bkgts,bskh->btkgh", probs, value)
    return context.reshape(batch, length, heads, dims)
