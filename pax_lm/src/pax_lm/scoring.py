"""Scoring: the log-likelihood a language model gives a continuation after a context.

This is the operation evaluation harnesses are built on (lm-eval's ``loglikelihood``): a
multiple-choice question is answered by the choice the model finds likeliest. Each request is
one row, ``[bos, context..., continuation...]``, and its score is the sum over the
continuation's tokens of the log-softmax at that token, with whether greedy decoding would have
produced exactly the continuation. The score of a token is what the training loss counts for it
(``LanguageModel``'s cross-entropy, negated), so a job's held-out loss and its scores agree.

Rows are sorted by length and batched ``batch_size`` at a time, right-padded to a bucket length
(a power of two, at most the model's ``max_seq_len``), so one program compiles per bucket,
whatever the requests. A row longer than the model's context loses context tokens from its left
(``truncated``), as harnesses do; a continuation that alone does not fit is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pax_core import UsageError
from pax_lm.inference.engine import prefill_buckets


@dataclasses.dataclass(frozen=True)
class Score:
    """A continuation's ``log_likelihood`` (natural log, summed over its ``num_tokens``
    tokens), whether greedy decoding gives it (``is_greedy``), and whether its context was cut
    on the left to fit the model (``truncated``)."""

    log_likelihood: float
    is_greedy: bool
    num_tokens: int
    truncated: bool


def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """A request's context tokens (``bos`` first, as training saw every document start) and its
    continuation's: the tokens of ``context + continuation`` past the context's own, so that a
    word split across the boundary is tokenized as the model reads the whole text."""
    context_ids = [tokenizer.bos_id, *tokenizer.encode(context)]
    whole = [tokenizer.bos_id, *tokenizer.encode(context + continuation)]
    if whole[: len(context_ids)] != context_ids:  # the boundary merged tokens: split as is
        return context_ids, list(tokenizer.encode(continuation))
    return context_ids, whole[len(context_ids):]


def bucket(length: int, max_len: int) -> int:
    """The padded length of a row of ``length`` inputs: the smallest of the decoding engine's
    prefill buckets (powers of two, then ``max_len``) that holds it."""
    return next(b for b in prefill_buckets(max_len) if b >= min(length, max_len))


class Scorer:
    """Scores requests with ``decoder`` (``ids -> logits``) and its ``variables``, ``batch_size``
    rows at a time, one compiled program per bucket length."""

    def __init__(self, decoder: Any, variables: dict[str, Any], batch_size: int = 8) -> None:
        if batch_size < 1:
            raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
        self.decoder, self.variables, self.batch_size = decoder, variables, batch_size
        self.max_len = int(decoder.max_seq_len)
        self._scores = jax.jit(self._batch_scores)

    def _batch_scores(self, variables: Any, ids: jax.Array, labels: jax.Array,
                      weights: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = self.decoder.apply(variables, ids).astype(jnp.float32)
        picked = jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1)[..., 0]
        greedy = (jnp.argmax(logits, -1) == labels) | (weights == 0)
        return jnp.sum(picked * weights, -1), jnp.all(greedy, -1)

    def score(self, requests: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[Score]:
        """One ``Score`` per ``(context ids, continuation ids)`` request, in order."""
        rows = [self._row(i, list(c), list(x)) for i, (c, x) in enumerate(requests)]
        order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
        out: list[Score | None] = [None] * len(rows)
        for start in range(0, len(order), self.batch_size):
            chosen = order[start:start + self.batch_size]
            width = bucket(max(len(rows[i][0]) - 1 for i in chosen), self.max_len)
            ids = np.zeros((self.batch_size, width), np.int32)
            labels = np.zeros((self.batch_size, width), np.int32)
            weights = np.zeros((self.batch_size, width), np.float32)
            for r, i in enumerate(chosen):
                tokens, scored, _ = rows[i]
                ids[r, : len(tokens) - 1], labels[r, : len(tokens) - 1] = tokens[:-1], tokens[1:]
                weights[r, len(tokens) - 1 - scored: len(tokens) - 1] = 1.0
            sums, greedy = jax.device_get(self._scores(self.variables, ids, labels, weights))
            for r, i in enumerate(chosen):
                out[i] = Score(float(sums[r]), bool(greedy[r]), rows[i][1], rows[i][2])
        return out  # type: ignore[return-value]

    def _row(self, index: int, context: list[int], continuation: list[int]
             ) -> tuple[list[int], int, bool]:
        """The tokens of request ``index`` (its context cut on the left to fit), how many of
        them are scored, and whether it was cut."""
        if not continuation:
            raise UsageError(f"request {index + 1}: the continuation is empty; there is nothing "
                             f"to score")
        if not context:
            raise UsageError(f"request {index + 1}: the context is empty; give at least the "
                             f"bos token")
        if len(continuation) > self.max_len:
            raise UsageError(f"request {index + 1}: the continuation is {len(continuation)} "
                             f"tokens; this model scores at most {self.max_len} at once")
        keep = min(len(context), self.max_len + 1 - len(continuation))
        return context[len(context) - keep:] + continuation, len(continuation), (
            keep < len(context))
