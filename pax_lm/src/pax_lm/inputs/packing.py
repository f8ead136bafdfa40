"""Rows of LM batches planned from document lengths alone.

A document enters a row as a token sequence: ``[bos, *text, eos]`` for text, a conversation as
its chat template wrote it (``pax_lm.sft``); the planner sees sequence lengths. A row of ``seq_len``
predictions holds ``seq_len + 1`` tokens, so consecutive pieces of one sequence overlap by one
token and every next-token prediction is trained exactly once. Two layouts:

* ``pack``: a document longer than a row is cut into pieces of ``seq_len`` predictions; pieces
  are packed first-fit (over the last few open rows, so the cost stays linear) into rows, each a
  segment of its own, so that no token attends across documents.
* ``concat``: the sequences as one stream cut into rows of ``seq_len`` predictions (Pax's
  ``reduce_concat``); a row is one segment and may span documents.

The planner sees only lengths, never tokens: every process plans every global batch (cheap) and
then reads the tokens of its own rows only. Its position is a pair of integers that means the
same rows on any number of processes: ``pack`` plans blocks of ``BLOCK_DOCUMENTS`` documents of
the stream independently (position: block, row in the block), ``concat`` is a cursor in the
stream (position: document, token).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np

PACKINGS = ("pack", "concat")
# Rows still open for more pieces while packing: enough to fill most gaps, few enough to keep
# packing linear in the number of pieces.
OPEN_ROWS = 8
# Documents packed together: the unit of planning of `pack` (its rows depend on nothing else).
BLOCK_DOCUMENTS = 1024


class Span(NamedTuple):
    """Tokens ``[first, first + count)`` of the token sequence of ``document`` of ``source``."""

    source: int
    document: int
    first: int
    count: int


# A segment is the spans whose tokens, joined, are its predictions plus one; a row is its
# segments in order (an empty row is padding).
Segment = list[Span]
Row = list[Segment]
Position = tuple[int, int]


def cut_pieces(starts: np.ndarray, lengths: np.ndarray, seq_len: int
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each run of ``lengths[i]`` tokens from ``starts[i]`` cut into pieces of at most
    ``seq_len`` predictions: the pieces' first tokens, prediction counts and runs ``i``."""
    predictions = lengths - 1
    count = -(-predictions // seq_len)
    run = np.repeat(np.arange(len(starts)), count)
    k = np.arange(len(run)) - np.repeat(np.cumsum(count) - count, count)
    return (starts[run] + k * seq_len, np.minimum(seq_len, predictions[run] - k * seq_len),
            run)


def first_fit(piece_len: np.ndarray, seq_len: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """First-fit packing of pieces, in order, over the last ``OPEN_ROWS`` rows that have room:
    each piece's row, column and segment number (1-based within the row)."""
    row, offset, segment = (np.empty(len(piece_len), np.int64) for _ in range(3))
    open_rows: list[list[int]] = []  # [row, used, segments]
    num_rows = 0
    for i, length in enumerate(piece_len.tolist()):
        slot = next((s for s in open_rows if s[1] + length <= seq_len), None)
        if slot is None:
            slot = [num_rows, 0, 0]
            num_rows += 1
            open_rows.append(slot)
        row[i], offset[i], segment[i] = slot[0], slot[1], slot[2] + 1
        slot[1] += length
        slot[2] += 1
        if slot[1] == seq_len:
            open_rows.remove(slot)
        elif len(open_rows) > OPEN_ROWS:
            open_rows.pop(0)
    return row, offset, segment


def pack_rows(documents: list[tuple[int, int]], lengths: np.ndarray, seq_len: int) -> list[Row]:
    """The packed rows of ``documents`` ((source, document) pairs whose sequences have
    ``lengths`` tokens)."""
    sequence = np.asarray(lengths, np.int64)
    first, count, owner = cut_pieces(np.zeros(len(sequence), np.int64), sequence, seq_len)
    row, _, _ = first_fit(count, seq_len)
    rows: list[Row] = [[] for _ in range(int(row.max()) + 1 if len(row) else 0)]
    for piece in range(len(count)):  # pieces arrive in column order within each row
        source, document = documents[owner[piece]]
        rows[row[piece]].append([Span(source, document, int(first[piece]),
                                      int(count[piece]) + 1)])
    return rows


@dataclasses.dataclass
class RowPlanner:
    """Rows of the document stream ``document(k)`` -> (source, document), ``k`` from 0 to
    ``num_documents`` (None: endless), whose sequence lengths ``lengths(pairs)`` gives."""

    document: Callable[[int], tuple[int, int]]
    lengths: Callable[[list[tuple[int, int]]], np.ndarray]
    num_documents: int | None
    seq_len: int
    packing: str = "pack"

    def rows(self, position: Position) -> Iterator[tuple[Row, Position]]:
        """Each row from ``position`` on, with the position after it."""
        if self.packing == "pack":
            return self._packed(position)
        return self._concatenated(position)

    def _documents(self, start: int, stop: int) -> list[tuple[int, int]]:
        if self.num_documents is not None:
            stop = min(stop, self.num_documents)
        return [self.document(k) for k in range(start, stop)]

    def _packed(self, position: Position) -> Iterator[tuple[Row, Position]]:
        block, first_row = position
        while True:
            documents = self._documents(block * BLOCK_DOCUMENTS, (block + 1) * BLOCK_DOCUMENTS)
            if not documents:
                return
            rows = pack_rows(documents, self.lengths(documents), self.seq_len)
            for r in range(first_row, len(rows)):
                yield rows[r], ((block, r + 1) if r + 1 < len(rows) else (block + 1, 0))
            block, first_row = block + 1, 0

    def _concatenated(self, position: Position) -> Iterator[tuple[Row, Position]]:
        k, token = position
        window: list[tuple[tuple[int, int], int]] = []  # (document, sequence length) from k on
        while True:
            spans: Segment = []
            need, at, j = self.seq_len + 1, token, 0
            while need > 0:
                if j == len(window):
                    more = self._documents(k + j, k + j + BLOCK_DOCUMENTS)
                    if not more:
                        break
                    window += zip(more, self.lengths(more).tolist(), strict=True)
                (source, document), length = window[j]
                take = min(need, length - at)
                spans.append(Span(source, document, at, take))
                need -= take
                at, j = (at + take, j) if at + take < length else (0, j + 1)
            tokens = sum(span.count for span in spans)
            if tokens < 2:
                return
            # The next row starts seq_len tokens on: its first token is this row's last label.
            token += min(tokens, self.seq_len + 1) - 1
            while window and token >= window[0][1]:
                token -= window[0][1]
                window.pop(0)
                k += 1
            yield [spans], (k, token)


def rows_per_batch(rows: Iterator[tuple[Row, Position]], batch_size: int
                   ) -> Iterator[tuple[list[Row], Position]]:
    """Global batches of ``batch_size`` rows with the position after each; the last of a finite
    stream is filled with empty rows (padding, weight 0)."""
    batch: list[Row] = []
    for row, position in rows:
        batch.append(row)
        if len(batch) == batch_size:
            yield batch, position
            batch = []
    if batch:
        yield batch + [[] for _ in range(batch_size - len(batch))], position
