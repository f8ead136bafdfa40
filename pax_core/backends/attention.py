"""The attention every layer calls, served by the backend of the platform the run is on.

Why through the backend: a fused kernel (cuDNN's on NVIDIA GPUs, Splash on TPUs) is a property
of the platform, not of the model, so a layer asks for attention by what it means (causal or
not, packed segments, a sliding window, a logit cap, a scale) and the running backend picks how.
Until a command starts the runtime, and in tests, JAX's default (XLA) serves it.
"""

from __future__ import annotations

import inspect

import jax

from pax_core.backends.base import Backend
from pax_core.backends.einsum import einsum_attention

_running: Backend = Backend()
# Whether the running backend's ``attention`` takes the keywords API 1.20 added (``window``,
# ``logit_cap``, ``scale``); a backend written against an earlier API serves the rest.
_takes_all = True
# The name every operation of the attention carries in a compiled program, so that ``pax plan
# --target`` can cost it as the one fused kernel a GPU's backend runs (``pax_core.speed.hlo``).
SCOPE = "dot_product_attention"
_ADDED = ("window", "logit_cap", "scale")


def use_backend(backend: Backend) -> None:
    """Make ``backend`` serve attention in this process (done when the runtime starts)."""
    global _running, _takes_all
    _running = backend
    accepted = inspect.signature(backend.attention).parameters
    _takes_all = all(name in accepted for name in _ADDED)


def dot_product_attention(query: jax.Array, key: jax.Array, value: jax.Array, *,
                          mask: jax.Array | None, is_causal: bool = False,
                          segment_ids: jax.Array | None = None, window: int = 0,
                          logit_cap: float = 0.0, scale: float | None = None) -> jax.Array:
    """Softmax attention: query [B, T, N, H], key and value [B, S, K, H] with K dividing N,
    giving [B, T, N, H]; the logits are ``query . key * scale`` (None: 1/sqrt(H)), then
    ``logit_cap * tanh(logits / logit_cap)`` where ``logit_cap`` > 0 (Gemma 2's soft cap,
    Pax's ``atten_logit_cap``).

    ``mask`` (broadcastable to [B, N, T, S], True where a query may see a key; None: all) is
    always the whole truth; ``is_causal`` (key j visible to query i iff j <= i, with T == S),
    ``segment_ids`` ([B, T]: a key visible only within its query's segment) and ``window``
    (w > 0 with ``is_causal``: only the w keys up to the query's own, j > i - w) say how it was
    made, so that a fused kernel can build it itself instead of reading it.
    """
    with jax.named_scope(SCOPE):
        if _takes_all:
            return _running.attention(query, key, value, mask=mask, is_causal=is_causal,
                                      segment_ids=segment_ids, window=window,
                                      logit_cap=logit_cap, scale=scale)
        if window or logit_cap or scale is not None:  # what that backend cannot be told
            return einsum_attention(query, key, value, mask, scale, logit_cap)
        return _running.attention(query, key, value, mask=mask, is_causal=is_causal,
                                  segment_ids=segment_ids)
