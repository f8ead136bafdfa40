"""What a decoding request asks for, and how the next token is drawn from the logits.

``SamplingSettings`` is one request's: how many tokens at most, greedy or sampled (temperature,
then top-k, then top-p filtering), its seed, and what stops it (token ids, strings). The
functions below draw the next token for a whole batch at once with every row's settings its
own, so that rows of different requests share one compiled step (``pax_lm.inference``); each
row's random key comes from its own seed and the position of the token it draws, never from
the batch, so a request draws the same tokens whatever else is decoded beside it. ``prompt_ids``
and ``until_eos`` say how every text interface (``pax decode``, ``pax serve``, ``pax_lm.load``)
turns a text prompt into a request.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any

import jax
import jax.numpy as jnp

from pax_core import UsageError

SEED_LIMIT = 2**32  # a seed is a uint32: JAX's key of it


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """One request's decoding settings: at most ``max_tokens`` new tokens; greedy when
    ``temperature`` is 0, else drawn from the logits over ``temperature`` kept to the ``top_k``
    likeliest tokens (0: all) and to the smallest set holding ``top_p`` of the probability;
    ``seed`` (0 <= seed < 2**32) makes the draw repeatable. Decoding stops at a token of
    ``stop_ids`` (not returned) or once the text holds a string of ``stop`` (the text is cut
    before it). Bad values are a ``UsageError`` naming the field: they come from users (the
    command line, a prompts file, a request)."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    stop: tuple[str, ...] = ()
    stop_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for name in ("max_tokens", "top_k", "seed"):
            _require(name, getattr(self, name), _is_int, "a whole number")
        for name in ("temperature", "top_p"):
            _require(name, getattr(self, name), _is_number, "a number")
        if self.max_tokens < 1:
            raise UsageError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise UsageError(f"temperature must be >= 0 (0: greedy), got {self.temperature}")
        if self.top_k < 0:
            raise UsageError(f"top_k must be >= 0 (0: every token), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UsageError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.seed < SEED_LIMIT:
            raise UsageError(f"seed must be in [0, 2**32), got {self.seed}")
        if not isinstance(self.stop, tuple) or not all(
                isinstance(s, str) and s for s in self.stop):
            raise UsageError(f"stop must be a list of non-empty strings, got {list(self.stop)!r}")
        if not isinstance(self.stop_ids, tuple) or not all(map(_is_int, self.stop_ids)):
            raise UsageError(f"stop_ids must be token ids, got {list(self.stop_ids)!r}")


def prompt_ids(tokenizer: Any, text: str) -> list[int]:
    """The tokens a text prompt is continued from: training saw every document as
    ``[bos, text, eos]``, so a prompt starts a document the same way."""
    return [tokenizer.bos_id, *tokenizer.encode(text)]


def until_eos(settings: Any, tokenizer: Any) -> Any:
    """``settings`` (``SamplingSettings``) that also stop at the tokenizer's eos."""
    return dataclasses.replace(settings, stop_ids=(*settings.stop_ids, tokenizer.eos_id))


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _require(name: str, value: object, check: Any, kind: str) -> None:
    if not check(value):
        raise UsageError(f"{name} must be {kind}, got {value!r}")


def filter_logits(logits: jax.Array, top_k: jax.Array | int, top_p: jax.Array | float
                  ) -> jax.Array:
    """``logits`` [B, V] with every token outside a row's ``top_k`` likeliest (0: none
    outside) or outside the smallest set holding its ``top_p`` of the probability set to -inf;
    ``top_k`` and ``top_p`` are one for every row or one a row ([B]). Ties with the last token
    kept are kept too."""
    rows, vocab = logits.shape
    top_k = jnp.broadcast_to(jnp.asarray(top_k, jnp.int32), (rows,))[:, None]
    top_p = jnp.broadcast_to(jnp.asarray(top_p, jnp.float32), (rows,))[:, None]
    ranked = jnp.sort(logits, axis=-1)[:, ::-1]
    kth = jnp.take_along_axis(ranked, jnp.clip(top_k - 1, 0, vocab - 1), axis=-1)
    kth = jnp.where(top_k > 0, kth, -jnp.inf)
    ranked = jnp.where(ranked < kth, -jnp.inf, ranked)  # still sorted: top-k's survivors
    probs = jax.nn.softmax(ranked, axis=-1)
    # A token is in the nucleus while the mass before it is below top_p.
    before = jnp.cumsum(probs, axis=-1) - probs
    cutoff = jnp.min(jnp.where(before < top_p, ranked, jnp.inf), axis=-1, keepdims=True)
    cutoff = jnp.where(top_p < 1, cutoff, -jnp.inf)
    return jnp.where(logits < jnp.maximum(kth, cutoff), -jnp.inf, logits)


def row_keys(seeds: jax.Array, positions: jax.Array) -> jax.Array:
    """One key a row ([B] of uint32 seeds, [B] positions -> [B, 2]): the row's seed folded
    with the position of the token it draws, so a row's draws depend on nothing else."""
    return jax.vmap(lambda s, p: jax.random.fold_in(jax.random.PRNGKey(s), p))(seeds, positions)


def sample(logits: jax.Array, seeds: jax.Array, positions: jax.Array, temperature: jax.Array,
           top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """The next token of each row ([B] int32) from its logits [B, V], with its own seed and
    the position it draws at (its key: ``row_keys``), temperature, top_k and top_p ([B] each):
    argmax where the temperature is 0. A batch of greedy rows only skips the keys and the
    filtering, whose sort over the vocabulary costs as much as a small model's step."""
    greedy = jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def drawn() -> jax.Array:
        scale = jnp.where(temperature > 0, temperature, 1.0)[:, None]
        filtered = filter_logits(logits / scale, top_k, top_p)
        keys = row_keys(seeds, positions)
        tokens = jax.vmap(jax.random.categorical)(keys, filtered).astype(jnp.int32)
        return jnp.where(temperature > 0, tokens, greedy)

    return jax.lax.cond(jnp.any(temperature > 0), drawn, lambda: greedy)
