"""CTC decoding and error rates.

Greedy decoding and the edit distances run inside the eval step, in JAX, so that word and
character error rates are metrics like any other: summed over the shards and batches by the
loop, logged per eval. The edit distance is the Levenshtein recurrence with one row per
hypothesis symbol (``lax.scan``) and the row computed at once: ``d[j] = min(e[j], d[j-1] + 1)``
unrolls to ``j + cummin(e[k] - k)``. Words become 32-bit hashes of their characters, so the
word error rate is the same recurrence over word ids.

Prefix beam search (Hannun et al. 2014) runs on the host for ``pax transcribe``.
"""

from __future__ import annotations

import collections
import math

import jax
import jax.numpy as jnp
import numpy as np

from pax_speech.vocab import BLANK

_HASH = np.uint32(0x9E3779B1)  # an odd multiplier: distinct short words, distinct hashes


def greedy_decode(logits: jax.Array, lengths: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Best path: the argmax class of each valid frame, repeats merged, blanks dropped.
    ``logits [B, T, V]`` -> (ids ``[B, T]`` left-aligned and zero-padded, lengths ``[B]``)."""
    best = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    valid = jnp.arange(best.shape[1])[None, :] < lengths[:, None]
    previous = jnp.pad(best[:, :-1], ((0, 0), (1, 0)), constant_values=BLANK)
    keep = valid & (best != BLANK) & (best != previous)
    return compact(best, keep)


def compact(ids: jax.Array, keep: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The kept ``ids`` of each row moved to its front, in order, the rest zeros."""
    slot = jnp.where(keep, jnp.cumsum(keep, axis=1) - 1, ids.shape[1])
    rows = jnp.arange(ids.shape[0])[:, None]
    out = jnp.zeros_like(ids).at[rows, slot].set(ids, mode="drop")
    return out, jnp.sum(keep, axis=1).astype(jnp.int32)


def edit_distance(hyp: jax.Array, hyp_lengths: jax.Array, ref: jax.Array,
                  ref_lengths: jax.Array) -> jax.Array:
    """Levenshtein distance (float32 ``[B]``) between each row's first ``hyp_lengths`` symbols
    of ``hyp [B, H]`` and first ``ref_lengths`` of ``ref [B, R]``."""
    batch, ref_size = ref.shape
    columns = jnp.arange(ref_size + 1, dtype=jnp.int32)
    first = jnp.broadcast_to(columns, (batch, ref_size + 1))

    def row(previous, step):
        i, symbol = step
        substitute = previous[:, :-1] + (symbol[:, None] != ref).astype(jnp.int32)
        delete = previous[:, 1:] + 1
        edge = jnp.full((batch, 1), i + 1, jnp.int32)
        best = jnp.concatenate([edge, jnp.minimum(substitute, delete)], axis=1)
        current = columns + jax.lax.cummin(best - columns, axis=1)
        return jnp.where((i < hyp_lengths)[:, None], current, previous), None

    steps = (jnp.arange(hyp.shape[1], dtype=jnp.int32), hyp.T)
    last, _ = jax.lax.scan(row, first, steps)
    return jnp.take_along_axis(last, ref_lengths[:, None], axis=1)[:, 0].astype(jnp.float32)


def words(chars: jax.Array, lengths: jax.Array, space: int) -> tuple[jax.Array, jax.Array]:
    """The words of character rows as hash ids: (``[B, L]`` left-aligned, counts ``[B]``)."""
    size = chars.shape[1]
    position = jnp.arange(size)[None, :]
    in_word = (position < lengths[:, None]) & (chars != space)
    starts = in_word & ~jnp.pad(in_word[:, :-1], ((0, 0), (1, 0)))
    index = jnp.where(in_word, jnp.cumsum(starts, axis=1) - 1, size)
    start = jax.lax.cummax(jnp.where(starts, position, 0), axis=1)
    powers = jnp.asarray(np.cumprod(np.full(size, _HASH, np.uint32), dtype=np.uint32))
    offset = jnp.clip(position - start, 0, size - 1)
    contribution = (chars.astype(jnp.uint32) + 1) * powers[offset]
    rows = jnp.arange(chars.shape[0])[:, None]
    hashed = jnp.zeros(chars.shape, jnp.uint32).at[rows, index].add(contribution, mode="drop")
    return hashed, jnp.sum(starts, axis=1).astype(jnp.int32)


def error_counts(hyp: jax.Array, hyp_lengths: jax.Array, ref: jax.Array,
                 ref_lengths: jax.Array, space: int) -> dict[str, jax.Array]:
    """Per utterance: character edits, reference characters, word edits, reference words."""
    hyp_words, hyp_count = words(hyp, hyp_lengths, space)
    ref_words, ref_count = words(ref, ref_lengths, space)
    return {"char_edits": edit_distance(hyp, hyp_lengths, ref, ref_lengths),
            "chars": ref_lengths.astype(jnp.float32),
            "word_edits": edit_distance(hyp_words, hyp_count, ref_words, ref_count),
            "words": ref_count.astype(jnp.float32)}


def prefix_beam_search(log_probs: np.ndarray, beam: int = 8) -> list[int]:
    """The most probable label sequence of one utterance's ``log_probs [T, V]`` (natural log,
    blank at 0), by CTC prefix beam search keeping ``beam`` prefixes per frame."""
    # Each prefix: (log P ending in blank, log P ending in its last label).
    beams: dict[tuple[int, ...], tuple[float, float]] = {(): (0.0, -math.inf)}
    candidates = min(beam, log_probs.shape[1])
    for frame in log_probs:
        top = np.argsort(frame)[::-1][:candidates]
        grown: dict[tuple[int, ...], list[float]] = collections.defaultdict(
            lambda: [-math.inf, -math.inf])
        for prefix, (blank, label) in beams.items():
            total = np.logaddexp(blank, label)
            for c in top.tolist():
                p = float(frame[c])
                if c == BLANK:
                    entry = grown[prefix]
                    entry[0] = np.logaddexp(entry[0], total + p)
                    continue
                extended = (*prefix, c)
                entry = grown[extended]
                if prefix and prefix[-1] == c:  # a repeat needs a blank between
                    entry[1] = np.logaddexp(entry[1], blank + p)
                    same = grown[prefix]
                    same[1] = np.logaddexp(same[1], label + p)
                else:
                    entry[1] = np.logaddexp(entry[1], total + p)
        ranked = sorted(grown.items(), key=lambda kv: -np.logaddexp(*kv[1]))[:beam]
        beams = {prefix: (b, lab) for prefix, (b, lab) in ranked}
    return list(max(beams.items(), key=lambda kv: np.logaddexp(*kv[1]))[0])
