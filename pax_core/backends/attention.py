"""The attention every layer calls, served by the backend of the platform the run is on.

Why through the backend: a fused kernel (cuDNN's on NVIDIA GPUs) is a property of the platform,
not of the model, so the transformer asks for attention by what it means (causal or not, packed
segments) and the running backend picks how. Until a command starts the runtime, and in tests,
JAX's default (XLA) serves it.
"""

from __future__ import annotations

import jax

from pax_core.backends.base import Backend

_running: Backend = Backend()
# The name every operation of the attention carries in a compiled program, so that ``pax plan
# --target`` can cost it as the one fused kernel a GPU's backend runs (``pax_core.speed.hlo``).
SCOPE = "dot_product_attention"


def use_backend(backend: Backend) -> None:
    """Make ``backend`` serve attention in this process (done when the runtime starts)."""
    global _running
    _running = backend


def dot_product_attention(query: jax.Array, key: jax.Array, value: jax.Array, *,
                          mask: jax.Array | None, is_causal: bool = False,
                          segment_ids: jax.Array | None = None) -> jax.Array:
    """Softmax attention with the 1/sqrt(head dim) scale: query [B, T, N, H], key and value
    [B, S, K, H] with K dividing N, giving [B, T, N, H].

    ``mask`` (broadcastable to [B, N, T, S], True where a query may see a key; None: all) is
    always the whole truth; ``is_causal`` (key j visible to query i iff j <= i, with T == S)
    and ``segment_ids`` ([B, T]: a key visible only within its query's segment) say how it was
    made, so that a fused kernel can build it itself instead of reading it.
    """
    with jax.named_scope(SCOPE):
        return _running.attention(query, key, value, mask=mask, is_causal=is_causal,
                                  segment_ids=segment_ids)
