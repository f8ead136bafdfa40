"""Language-model batches from text: the default corpus or the user's files.

Construction reads and tokenizes the documents of one split and lays them out as rows of
``seq_len`` positions, all in memory as numpy arrays, so that a user's mistake (a missing file, a
corpus too small for one batch) stops ``pax train`` before anything is written. The core's
``IndexedInput`` then gives seeded shuffling, repetition, the per-process rows and the position
to checkpoint.

Each document is tokenized as ``[bos, *text, eos]`` and laid out as ``pax_lm.inputs.packing``
describes (``pack``: first-fit, a segment per piece; ``concat``: one stream cut into rows), here
for the whole split at once. For corpora too large for memory, prepare them (``pax data
prepare``) and read them with ``pax_lm.inputs.tokens.TokensInput``. ``RowsInput`` is what any
input of rows made in memory shares (``pax_lm.sft.chat_input.ChatInput`` is another), and
``lay_out_rows`` lays out token sequences with, optionally, a weight per token.

Global batch ``k`` is rows ``k*batch_size ... (k+1)*batch_size-1`` of the (shuffled) row stream
whatever the process count, and each process takes its block of them; so the position (a number
of batches, with a key of the rows and settings) means the same data on any topology. A position
an older pax-lm saved (grain's ``{"next_index": n}``, n batches) is read as n batches.

The held-out split is chosen by a hash of each document's text: it does not depend on ``seed``
(a train and an eval input with different seeds still never share a document), identical
documents fall on the same side, and adding files moves few documents across.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from pax_core import UsageError, fingerprint
from pax_lm.corpus import default_corpus, read_documents
from pax_lm.inputs.base import LmInput
from pax_lm.inputs.packing import cut_pieces, first_fit
from pax_lm.tokenizers import Tokenizer

SPLITS = ("train", "eval")


def check_split(where: str, split: str, eval_fraction: float) -> None:
    """Refuse a ``split`` that is not one of ``SPLITS``, or an ``eval_fraction`` outside
    [0, 1) (0 holds nothing out, so only ``train`` is there)."""
    if split not in SPLITS:
        raise UsageError(f"{where}: split must be one of {', '.join(SPLITS)}, got {split!r}")
    if not 0 <= eval_fraction < 1 or (eval_fraction == 0 and split == "eval"):
        raise UsageError(f"{where}: eval_fraction must be in [0, 1) (0: no held-out split, "
                         f"split 'train' only), got {eval_fraction}")


@dataclasses.dataclass
class RowsInput(LmInput):
    """Base of the inputs whose rows are made in memory from one split of their source (text,
    conversations): built on first use, refused when too few for a batch, padded to whole
    batches when finite, and read by index. A subclass makes the rows (``_split_rows``) and
    names its source."""

    READ_AHEAD: ClassVar[int] = 0
    MATERIAL: ClassVar[str] = "text"  # what the user gives more of when a split is too small

    split: str = "train"
    eval_fraction: float = 0.02

    def __post_init__(self):
        super().__post_init__()
        self._loaded: tuple[dict[str, np.ndarray], int, str] | None = None

    def _data(self) -> tuple[dict[str, np.ndarray], int, str]:
        """The tokenized rows, how many hold text and a fingerprint of them, made on first use:
        building the config reads no data, so an experiment can be planned or printed without
        it."""
        if self._loaded is None:
            self._loaded = self._load()
        return self._loaded

    def check(self) -> None:
        self._data()

    @property
    def _rows(self) -> dict[str, np.ndarray]:
        return self._data()[0]

    @property
    def num_rows(self) -> int:
        """Rows of text (padding rows aside)."""
        return self._data()[1]

    def _split_rows(self) -> dict[str, np.ndarray]:
        """The rows of this split, as ``lay_out_rows`` makes them."""
        raise NotImplementedError(f"{type(self).__name__} must define _split_rows()")

    def _source(self) -> str:
        """The source as messages name it."""
        raise NotImplementedError(f"{type(self).__name__} must define _source()")

    def _load(self) -> tuple[dict[str, np.ndarray], int, str]:
        rows = self._split_rows()
        text_rows = len(rows["ids"])
        if text_rows < self.batch_size:
            raise UsageError(
                f"input '{self.name}': the {self.split} split of {self._source()} makes "
                f"{text_rows} rows of {self.seq_len} tokens, fewer than batch_size "
                f"{self.batch_size}; lower batch_size or seq_len"
                + (", raise eval_fraction" if self.split == "eval" else "")
                + f" or give more {self.MATERIAL}")
        if not self.repeats:
            rows = self._padded_to_whole_batches(rows)
        identity = hashlib.sha256()
        for key in sorted(rows):
            identity.update(np.ascontiguousarray(rows[key]).tobytes())
        return rows, text_rows, identity.hexdigest()[:16]

    def _check_fields(self) -> None:
        super()._check_fields()
        check_split(f"input '{self.name}'", self.split, self.eval_fraction)

    def _padded_to_whole_batches(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = -len(rows["ids"]) % self.batch_size
        fill = {"ids": self.tokenizer.pad_id, "labels": self.tokenizer.pad_id}
        return {k: np.pad(v, ((0, missing), (0, 0)), constant_values=fill.get(k, 0))
                for k, v in rows.items()}

    # The stream (IndexedInput).

    def data_key(self) -> str:
        return fingerprint(self.seed, self.shuffles, self.repeats, self.batch_size,
                           self._data()[2])

    def num_batches(self) -> int:
        return len(self._rows["ids"]) // self.batch_size  # padded to whole batches

    def batch_reader(self) -> _GatherRows:
        return _GatherRows(self._rows, self.example_order(len(self._rows["ids"])),
                           self.batch_size, self.process_rows())

    def set_state(self, state: dict[str, Any]) -> None:
        if isinstance(state, dict) and set(state) == {"next_index"}:
            state = {"batches": state["next_index"], self.KEY_NAME: self.data_key()}
        super().set_state(state)


@dataclasses.dataclass
class TextInput(RowsInput):
    """Next-token batches ``ids``, ``labels``, ``weights``, ``segment_ids``, ``segment_pos``
    (each ``[local batch, seq_len]``) from ``path`` (None: the default corpus; else a ``.txt``
    or ``.jsonl`` file or a folder of them, see ``pax_lm.corpus.read_documents``).

    ``split="eval"`` holds out ``eval_fraction`` of the documents (at least one); ``"train"`` is
    the rest. A finite input ends with ``StopIteration``; its last batch is filled with padding
    rows (weight 0), so every held-out token is evaluated once and every process reads the same
    number of batches.
    ``num_rows`` is the number of rows of text (padding rows aside).
    """

    CHANGED: ClassVar[str] = ("the text, tokenizer, split, seed, batch_size, seq_len, packing, "
                              "shuffle or repeat")

    path: str | None = None
    text_key: str = "text"

    def _split_rows(self) -> dict[str, np.ndarray]:
        documents = self._documents()
        if self.eval_fraction > 0:
            documents = split_documents(documents, self.split, self.eval_fraction,
                                        self._source())
        return _make_rows(self.tokenizer.encode_batch(documents), self.tokenizer,
                          self.seq_len, self.packing)

    def _source(self) -> str:
        return self.path if self.path is not None else "the default corpus"

    def _documents(self) -> list[str]:
        if self.path is None:
            return default_corpus()
        return read_documents(self.path, self.text_key)


class _GatherRows:
    """Global batch ``k`` -> this process's rows of it, from the rows in memory."""

    def __init__(self, rows: dict[str, np.ndarray], order: Any, batch_size: int,
                 process_rows: slice):
        self.rows, self.order, self.batch_size = rows, order, batch_size
        self.process_rows = range(process_rows.start, process_rows.stop)

    def __call__(self, k: int) -> dict[str, np.ndarray]:
        indices = [self.order[k * self.batch_size + row] for row in self.process_rows]
        batch = {key: v[indices].astype(np.int32) for key, v in self.rows.items()
                 if key != "weights"}
        weights = self.rows.get("weights")  # rows that train on some tokens only carry theirs
        batch["weights"] = (batch["segment_ids"] > 0 if weights is None
                            else weights[indices]).astype(np.float32)
        return batch


def split_documents(documents: Sequence[str], split: str, eval_fraction: float,
                    source: str = "the corpus") -> list[str]:
    """The documents of ``split``, in corpus order: ``eval`` is the ``eval_fraction`` (at least
    one) with the smallest text hashes, together with any duplicate of them; ``train`` the
    rest."""
    if len(documents) < 2:
        raise UsageError(f"{source} has {len(documents)} document(s); at least 2 are needed to "
                         f"hold one out for evaluation (give several files or a JSONL file)")
    held = held_out(text_hashes(documents), eval_fraction)
    chosen = held if split == "eval" else ~held
    if not chosen.any():
        raise UsageError(f"{source}: every document is held out for evaluation (they are all "
                         f"identical); give more varied text")
    return [d for d, keep in zip(documents, chosen, strict=True) if keep]


def text_hashes(texts: Sequence[str]) -> np.ndarray:
    """The hash that places each text in a split (uint64): kept beside prepared conversations
    so that their split is chosen without reading them."""
    return np.array([int.from_bytes(hashlib.blake2b(t.encode(), digest_size=8).digest(), "big")
                     for t in texts], np.uint64)


def held_out(hashes: np.ndarray, eval_fraction: float) -> np.ndarray:
    """Which of the texts of ``hashes`` are held out: the ``eval_fraction`` (at least one) with
    the smallest hashes, and every text equal to one of them."""
    num_eval = max(1, round(eval_fraction * len(hashes)))
    return hashes <= np.partition(hashes, num_eval - 1)[num_eval - 1]


def _make_rows(documents: list[np.ndarray], tokenizer: Tokenizer, seq_len: int,
               packing: str) -> dict[str, np.ndarray]:
    """The rows of the tokenized ``documents``, each as ``[bos, *text, eos]``; it empties
    ``documents`` as it goes, so that the corpus is held about once."""
    lengths = np.array([len(doc) + 2 for doc in documents], np.int64)
    stream = np.empty(int(lengths.sum()), np.int32)
    at = 0
    for i, doc in enumerate(documents):  # [bos, text, eos] per document, in place
        stream[at], stream[at + 1:at + 1 + len(doc)], stream[at + 1 + len(doc)] = (
            tokenizer.bos_id, doc, tokenizer.eos_id)
        at += len(doc) + 2
        documents[i] = None
    return lay_out_rows(stream, lengths, tokenizer, seq_len, packing)


def lay_out_rows(stream: np.ndarray, lengths: np.ndarray, tokenizer: Tokenizer, seq_len: int,
                 packing: str, trained: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """``ids``, ``labels``, ``segment_ids`` and ``segment_pos`` (``[rows, seq_len]``) of the
    token sequences of ``lengths`` that follow one another in ``stream``, laid out as
    ``pax_lm.inputs.packing`` describes; padding has ``segment_ids`` 0 and the pad id. With
    ``trained`` (a flag per token of ``stream``), ``weights`` too: 1 where the label is a token
    to train on, 0 elsewhere (batches take it instead of every non-padding position).

    Each array takes the narrowest unsigned type that holds its values (uint16 for a vocabulary
    and a row of under 65,536), and the tokens are copied piece by piece rather than through
    per-token index arrays: the rows of a corpus take a quarter of int64 indices' memory, and
    the process keeps no high-water mark from building them (``_GatherRows`` widens each batch)."""
    if packing == "pack":
        piece_start, piece_len, _ = cut_pieces(np.cumsum(lengths) - lengths, lengths, seq_len)
        row, offset, segment = first_fit(piece_len, seq_len)
    else:  # the stream as one run: a row per piece, one segment each
        piece_start, piece_len, _ = cut_pieces(np.array([0]), np.array([len(stream)]), seq_len)
        row = np.arange(len(piece_len))
        offset, segment = np.zeros_like(row), np.ones_like(row)
    shape = (int(row.max()) + 1, seq_len)
    tokens, places = _narrowest(tokenizer.vocab_size), _narrowest(seq_len + 1)
    rows = {"ids": np.full(shape, tokenizer.pad_id, tokens),
            "labels": np.full(shape, tokenizer.pad_id, tokens),
            "segment_ids": np.zeros(shape, places), "segment_pos": np.zeros(shape, places)}
    if trained is not None:
        rows["weights"] = np.zeros(shape, np.uint8)
    columns = np.arange(seq_len)
    for r, c, n, s, g in zip(row.tolist(), offset.tolist(), piece_len.tolist(),
                             piece_start.tolist(), segment.tolist(), strict=True):
        rows["ids"][r, c:c + n] = stream[s:s + n]
        rows["labels"][r, c:c + n] = stream[s + 1:s + n + 1]
        rows["segment_ids"][r, c:c + n] = g
        rows["segment_pos"][r, c:c + n] = columns[:n]
        if trained is not None:
            rows["weights"][r, c:c + n] = trained[s + 1:s + n + 1]
    return rows


def _narrowest(bound: int) -> type:
    """The narrowest unsigned integer type for values below ``bound``."""
    return next(t for t in (np.uint8, np.uint16, np.uint32) if bound <= np.iinfo(t).max + 1)
