"""Beam search: the likeliest continuations of one prompt, rather than one drawn token by token.

The prompt is prefilled once (one row, right-padded to a bucket length as the engine's are) and
its cache copied into ``beam_size`` rows, one a beam. Each step then, in one compiled program,
takes the log-softmax of every beam's next-token logits, adds it to the beam's log-probability
so far, picks the ``beam_size`` best of the ``beam_size * vocab`` candidates, gathers the cache
rows of the beams they extend (their parents) and feeds the chosen tokens. At the first step
every beam holds the same prompt, so only the first one's candidates count (the others start at
-inf).

A candidate ending in ``eos_id`` does not stay in the beam: it is a finished hypothesis, and
the best ``beam_size`` of them, by normalised score, are kept on the host. The score is the
log-probability divided by GNMT's length penalty ``((5 + length) / 6) ** length_norm_alpha``
(``length`` the hypothesis's tokens, eos included), which with ``alpha > 0`` lets a longer
hypothesis beat a shorter one of a higher log-probability. The search ends once no live beam
can beat the worst kept finished one (a live beam's log-probability only falls as it grows, so
its best possible score is its log-probability over the penalty of the longest it may grow), or
when the beams reach ``max_tokens`` or the model's maximum length; the live beams then count as
hypotheses too, ended by length. The log-probabilities are the model's own, in float32 whatever
the model computes in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pax_core import UsageError
from pax_lm.inference.batching import FinishReason
from pax_lm.inference.cache import cache_shapes, row_axes, state_placement
from pax_lm.inference.engine import SMALLEST_BUCKET, Engine, prefill_buckets


@dataclasses.dataclass(frozen=True)
class Hypothesis:
    """One continuation found: its ``tokens`` (ending in eos when it finished there),
    ``log_prob`` (natural log, summed over the tokens, eos included), ``score`` (``log_prob``
    over the length penalty; equal to it when ``length_norm_alpha`` is 0) and
    ``finish_reason``: ``stop`` (eos) or ``length`` (``max_tokens`` or the model's maximum
    length)."""

    tokens: list[int]
    log_prob: float
    score: float
    finish_reason: FinishReason


def length_penalty(length: int, alpha: float) -> float:
    """GNMT's length penalty ``((5 + length) / 6) ** alpha``: what a log-probability is divided
    by to compare hypotheses of different lengths."""
    return ((5 + length) / 6) ** alpha


class BeamSearch:
    """Beam search of ``beam_size`` beams over ``decoder`` (a ``TransformerLm``: its cache holds
    a per-row ``index``) with ``variables`` (its ``params`` and any other collection it reads).

    Its programs compile the first time they are called and serve every prompt after: one
    prefill a bucket of prompt lengths, one step (``compilations`` counts them).
    """

    def __init__(self, decoder: Any, variables: dict[str, Any], beam_size: int,
                 smallest_bucket: int = SMALLEST_BUCKET) -> None:
        if beam_size < 1:
            raise UsageError(f"the beam size must be >= 1, got {beam_size}")
        self.decoder, self.beam_size = decoder, beam_size
        self.max_seq_len: int = decoder.max_seq_len
        self.buckets = prefill_buckets(self.max_seq_len, smallest_bucket)
        self._row_cache = cache_shapes(decoder, 1)
        self._axes = row_axes(decoder)
        placement = state_placement(variables)
        self.variables = jax.tree.map(
            lambda x: x if isinstance(x, jax.Array) else jax.device_put(x, placement), variables)
        self._prefill = jax.jit(self._prefill_beams, out_shardings=placement)
        self._step = jax.jit(self._step_beams, out_shardings=placement, donate_argnums=1)

    # The engine's own: a prompt is refused, and padded to a bucket, as the engine does it.
    check_prompt = Engine.check_prompt
    bucket = Engine.bucket

    def search(self, prompt: Sequence[int], max_tokens: int, length_norm_alpha: float = 0.0,
               eos_id: int | None = None) -> list[Hypothesis]:
        """The best hypotheses (at most ``beam_size``) that continue ``prompt``, best score
        first; each has at most ``max_tokens`` tokens, eos included."""
        self.check_prompt(prompt)
        if max_tokens < 1:
            raise UsageError(f"max_tokens must be >= 1, got {max_tokens}")
        if length_norm_alpha < 0:
            raise UsageError(f"length_norm_alpha must be >= 0, got {length_norm_alpha}")
        limit = min(max_tokens, self.max_seq_len - len(prompt))
        longest = length_penalty(limit, length_norm_alpha)
        ids = np.zeros((1, self.bucket(len(prompt))), np.int32)
        ids[0, :len(prompt)] = prompt
        state = self._prefill(self.variables, ids, np.int32(len(prompt)))
        eos = np.int32(-1 if eos_id is None else eos_id)
        beams: list[list[int]] = [[] for _ in range(self.beam_size)]
        finished: list[Hypothesis] = []
        for length in range(1, limit + 1):
            state, picked = self._step(self.variables, state, eos)
            parents, tokens, scores, ended = jax.device_get(picked)
            for parent, log_prob in enumerate(ended.tolist()):
                if log_prob > -np.inf:
                    score = log_prob / length_penalty(length, length_norm_alpha)
                    finished.append(Hypothesis([*beams[parent], eos_id], log_prob, score,
                                               "stop"))
            finished = _best(finished, self.beam_size)
            beams = [[*beams[p], t] for p, t in zip(parents.tolist(), tokens.tolist(),
                                                    strict=True)]
            if (len(finished) == self.beam_size
                    and scores.max() / longest <= finished[-1].score):
                return finished  # no live beam can get into the kept finished ones
        live = [Hypothesis(b, s, s / longest, "length")
                for b, s in zip(beams, scores.tolist(), strict=True) if s > -np.inf]
        return _best(finished + live, self.beam_size)

    def compilations(self) -> dict[str, int]:
        """How many programs each call has compiled: ``prefill`` one a bucket used, ``step``
        one."""
        return {"prefill": self._prefill._cache_size(), "step": self._step._cache_size()}

    def _prefill_beams(self, variables: dict[str, Any], ids: jax.Array, length: jax.Array
                       ) -> dict[str, Any]:
        """The beams' first state: the right-padded prompt's cache (its index set back to the
        prompt's length) in every row, each row's next-token log-probabilities, and the beams'
        log-probabilities so far: 0 for the first, -inf for the others (the same prompt)."""
        empty = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), self._row_cache)
        logits, mutated = self.decoder.apply({**variables, "cache": empty}, ids, decode=True,
                                             mutable=["cache"])
        cache = {**mutated["cache"], "index": jnp.reshape(length, (1,))}
        last = jax.lax.dynamic_slice_in_dim(logits[0], length - 1, 1)
        k = self.beam_size
        return {"cache": jax.tree.map(lambda x, axis: jnp.repeat(x, k, axis), cache, self._axes),
                "log_probs": jnp.repeat(jax.nn.log_softmax(last.astype(jnp.float32)), k, 0),
                "scores": jnp.full((k,), -jnp.inf, jnp.float32).at[0].set(0.0)}

    def _step_beams(self, variables: dict[str, Any], state: dict[str, Any], eos: jax.Array
                    ) -> tuple[dict[str, Any], tuple[jax.Array, ...]]:
        """Extend the beams by one token; with the new state, what the host needs: each new
        beam's parent and token, the new beams' log-probabilities and each old beam's
        log-probability ended with ``eos`` (-inf without one, ``eos`` < 0)."""
        k, vocab = state["log_probs"].shape
        total = state["scores"][:, None] + state["log_probs"]
        is_eos = jnp.arange(vocab) == eos
        ended = jnp.where(eos >= 0, total[:, jnp.maximum(eos, 0)], -jnp.inf)
        scores, flat = jax.lax.top_k(jnp.where(is_eos, -jnp.inf, total).reshape(-1), k)
        parents, tokens = flat // vocab, (flat % vocab).astype(jnp.int32)
        cache = jax.tree.map(lambda x, axis: jnp.take(x, parents, axis), state["cache"],
                             self._axes)
        logits, mutated = self.decoder.apply({**variables, "cache": cache}, tokens[:, None],
                                             decode=True, mutable=["cache"])
        log_probs = jax.nn.log_softmax(logits[:, 0].astype(jnp.float32))
        new = {"cache": mutated["cache"], "log_probs": log_probs, "scores": scores}
        return new, (parents, tokens, scores, ended)


def _best(hypotheses: list[Hypothesis], count: int) -> list[Hypothesis]:
    return sorted(hypotheses, key=lambda h: h.score, reverse=True)[:count]


def beam_search(decoder: Any, variables: dict[str, Any], prompt: Sequence[int],
                beam_size: int, max_tokens: int, length_norm_alpha: float = 0.0,
                eos_id: int | None = None) -> list[Hypothesis]:
    """The best hypotheses (at most ``beam_size``, best score first) that continue ``prompt``
    by at most ``max_tokens`` tokens, for a caller with a single prompt (``BeamSearch`` keeps
    its compiled programs for the next)."""
    return BeamSearch(decoder, variables, beam_size).search(prompt, max_tokens,
                                                             length_norm_alpha, eos_id)
