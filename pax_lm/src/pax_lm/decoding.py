"""Sampling text from a trained decoder with its KV cache.

The prompt is fed in one call (prefill), then one token per step; each step is one jitted call
that returns the next token, so the host only sees token ids. Greedy when ``temperature`` is 0;
otherwise temperature, then top-k, then top-p (nucleus) filtering.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pax_core import UsageError


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    max_decode_steps: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.max_decode_steps < 1:
            raise UsageError(f"--max-decode-steps must be >= 1, got {self.max_decode_steps}")
        if self.temperature < 0:
            raise UsageError(f"--temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise UsageError(f"--top-k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"--top-p must be in (0, 1], got {self.top_p}")


def _filter_logits(logits: jax.Array, top_k: int, top_p: float) -> jax.Array:
    """Mask out tokens outside the top-k and outside the smallest set holding top_p mass."""
    if top_k > 0:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    if top_p < 1.0:
        sorted_logits = jnp.sort(logits, axis=-1)[..., ::-1]
        cumulative = jnp.cumsum(jax.nn.softmax(sorted_logits, axis=-1), axis=-1)
        # The cut-off is the smallest logit whose preceding mass is still below top_p.
        keep = (cumulative - jax.nn.softmax(sorted_logits, axis=-1)) < top_p
        cutoff = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits < cutoff, -jnp.inf, logits)
    return logits


def choose(logits: jax.Array, key: jax.Array, settings: SamplingSettings) -> jax.Array:
    """The next token from the last position's logits ``[B, V]``."""
    if settings.temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = _filter_logits(logits / settings.temperature, settings.top_k, settings.top_p)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def generate(decoder: Any, variables: dict[str, Any], prompt: list[int],
             settings: SamplingSettings, eos_id: int | None = None) -> list[int]:
    """Tokens that follow ``prompt`` (the prompt itself not included).

    ``variables`` are the decoder's: ``params``, and any other collection it reads (an FP8
    model's scales).

    Stops at ``eos_id``, after ``max_decode_steps`` tokens, or when the decoder's
    ``max_seq_len`` is reached, whichever comes first.
    """
    max_len = decoder.max_seq_len
    if not prompt:
        raise UsageError("the prompt is empty")
    if len(prompt) >= max_len:
        raise UsageError(f"the prompt is {len(prompt)} tokens long; this model's maximum length "
                         f"is {max_len}, so the prompt must be at most {max_len - 1} tokens")
    steps = min(settings.max_decode_steps, max_len - len(prompt))
    cache = _empty_cache(decoder, max_len)

    @partial(jax.jit, donate_argnums=1)
    def step(ids, cache, positions, key):
        logits, updated = decoder.apply({**variables, "cache": cache}, ids,
                                        positions=positions, decode=True, mutable=["cache"])
        return choose(logits[:, -1], key, settings), updated["cache"]

    keys = jax.random.split(jax.random.PRNGKey(settings.seed), steps)
    ids = jnp.asarray([prompt], jnp.int32)
    positions = jnp.arange(len(prompt), dtype=jnp.int32)[None]
    out: list[int] = []
    for i in range(steps):
        token, cache = step(ids, cache, positions, keys[i])
        value = int(token[0])
        if value == eos_id:
            break
        out.append(value)
        ids = token[:, None]
        positions = jnp.full((1, 1), len(prompt) + i, jnp.int32)
    return out


def _empty_cache(decoder: Any, max_len: int) -> Any:
    """A zeroed KV cache of the decoder's shape, without initialising any parameters."""
    shapes = jax.eval_shape(
        lambda: decoder.init(jax.random.PRNGKey(0), jnp.zeros((1, max_len), jnp.int32),
                             decode=True)
    )
    return jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), shapes["cache"])
