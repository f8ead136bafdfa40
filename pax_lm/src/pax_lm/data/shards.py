"""Prepared token datasets: the directory ``pax data prepare`` writes and the inputs read.

::

    DIR/
      metadata.json   what the directory holds: format and version, the tokenizer (name,
                      vocabulary size, fingerprint of its model file), the token dtype, counts,
                      the shards (name, documents, tokens, bytes), the sources (path, bytes,
                      SHA-256), whether records carry a loss mask (``loss_mask``) and, if so,
                      the chat template that wrote them (``chat_template``: name, fingerprint)
      index.npy       the token count of every document, in shard order (4 bytes a document,
                      memory-mapped): what a batch planner reads, so that it never reads tokens
      hashes.npy      conversations only: the hash of each one's turns (8 bytes a document),
                      from which a held-out split is chosen as ``ChatInput`` chooses it
      shards/tokens-00000.array_record, ...
                      ArrayRecord files, one record per document: its token ids as
                      little-endian integers of the token dtype; text is stored without bos or
                      eos, a conversation as its chat template wrote it (bos included), then,
                      where ``loss_mask`` is true, one bit per token (``numpy.packbits``, first
                      token in the high bit): 1 on the tokens to train on

Version 2 added ``loss_mask``, ``chat_template`` and ``hashes.npy``; a version-1 directory is text
and still reads. ``metadata.json`` is written last, so a directory without it is not (yet) a
dataset. Opening one checks what a run would otherwise trip over later: the files, their sizes,
the index length, and that it holds what the reader wants (text or conversations).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from pax_core import UsageError

FORMAT = "pax-tokens"
VERSION = 2
READABLE = (1, 2)
METADATA = "metadata.json"
INDEX = "index.npy"
HASHES = "hashes.npy"
SHARDS = "shards"
# One record per group: a document is read without decompressing its neighbours (random access).
WRITER_OPTIONS = "group_size:1"
PREPARE_HINT = "make one with: pax data prepare SRC --output DIR"
# What a reader wants of a dataset (``PreparedDataset.open``).
TEXT, CHAT = "text", "chat"


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type that holds every id: 2 bytes a token for vocabularies up to
    65,536 (C4's 32k SentencePiece model, GPT-2's 50k), else 4."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def shard_name(number: int) -> str:
    return f"{SHARDS}/tokens-{number:05d}.array_record"


def masked_record(ids: np.ndarray, trained: np.ndarray, dtype: np.dtype | str) -> bytes:
    """The record of a document whose ``trained`` tokens carry the loss."""
    return np.asarray(ids, dtype).tobytes() + np.packbits(np.asarray(trained, bool)).tobytes()


def record_bytes(tokens: int | np.ndarray, dtype: np.dtype, masked: bool) -> int | np.ndarray:
    """The size of the record of a document of ``tokens`` tokens (of each, for an array)."""
    return tokens * dtype.itemsize + (-(-tokens // 8) if masked else 0)


@dataclasses.dataclass(frozen=True)
class Shard:
    """One ArrayRecord file of a prepared dataset."""

    name: str
    documents: int
    tokens: int
    bytes: int


class PreparedDataset:
    """A prepared directory opened for reading. Picklable by path (input workers reopen it)."""

    def __init__(self, path: str | Path, metadata: dict[str, Any]):
        self.path = Path(path)
        self.metadata = metadata
        self.shards = [Shard(**s) for s in metadata["shards"]]
        self.dtype = np.dtype(metadata["dtype"])

    @classmethod
    def open(cls, path: str | Path, content: str | None = TEXT) -> PreparedDataset:
        """Open ``path``, or raise ``UsageError`` naming what is missing or damaged, or that it
        holds conversations where ``content`` is text, or text where it is chat (None: either,
        for inspecting)."""
        root = Path(path)
        if not root.is_dir():
            raise UsageError(f"no such data directory: {root} ({PREPARE_HINT})")
        metadata = read_metadata(root)
        dataset = cls(root, metadata)
        if content == TEXT and dataset.loss_mask:
            raise UsageError(
                f"{root} holds conversations with loss masks (pax data prepare --chat), not "
                f"text to pretrain on; fine-tune on it with SFT_DATA, or prepare text without "
                f"--chat")
        if content == CHAT and not dataset.loss_mask:
            raise UsageError(
                f"{root} holds text (prepared without --chat), not conversations; prepare the "
                f"conversations with pax data prepare SRC --chat --output DIR, or train on "
                f"this text with TRAIN_DATA")
        dataset._check_files()
        return dataset

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "metadata": self.metadata}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"], state["metadata"])

    @property
    def num_documents(self) -> int:
        return int(self.metadata["documents"])

    @property
    def num_tokens(self) -> int:
        return int(self.metadata["tokens"])

    @property
    def loss_mask(self) -> bool:
        """Whether each record carries a loss mask (conversations, ``pax data prepare
        --chat``)."""
        return bool(self.metadata.get("loss_mask", False))

    @property
    def chat_template(self) -> dict[str, str]:
        """``name`` and ``fingerprint`` of the chat template that wrote the conversations."""
        return self.metadata["chat_template"]

    @property
    def fingerprint(self) -> str:
        """Changes when the documents do: the tokenizer's and every shard's record (and the
        chat template's, for conversations)."""
        parts = [self.tokenizer["fingerprint"], self.metadata["shards"]]
        return json.dumps([*parts, self.chat_template] if self.loss_mask else parts)

    @property
    def tokenizer(self) -> dict[str, Any]:
        """``name``, ``vocab_size`` and ``fingerprint`` of the tokenizer the shards hold."""
        return self.metadata["tokenizer"]

    @functools.cached_property
    def index(self) -> np.ndarray:
        """Token count of every document (memory-mapped)."""
        return np.load(self.path / INDEX, mmap_mode="r")

    @functools.cached_property
    def _source(self) -> Any:
        import grain

        return grain.sources.ArrayRecordDataSource([str(self.path / s.name) for s in self.shards])

    def lengths(self, documents: np.ndarray) -> np.ndarray:
        """Text token counts of ``documents`` (indices in shard order)."""
        return np.asarray(self.index[documents], np.int64)

    @functools.cached_property
    def _first_documents(self) -> np.ndarray:
        return np.cumsum([0] + [s.documents for s in self.shards])

    @functools.cached_property
    def hashes(self) -> np.ndarray:
        """The split hash of every conversation (memory-mapped; ``loss_mask`` datasets)."""
        return np.load(self.path / HASHES, mmap_mode="r")

    def tokens(self, documents: list[int]) -> list[np.ndarray]:
        """The token ids of ``documents``, read together (ArrayRecord reads them in parallel)."""
        return [ids for ids, _ in self.masked_tokens(documents)]

    def masked_tokens(self, documents: list[int]
                      ) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """The token ids of ``documents`` with, where the dataset has them, their loss masks
        (bool, 1 on the tokens to train on)."""
        try:
            records = self._source.__getitems__(documents)
        except (RuntimeError, ValueError) as e:  # the C++ reader's status, as text
            raise self._damaged(min(documents), short(e)) from None
        if not self.loss_mask:
            return [(np.frombuffer(r, self.dtype).astype(np.int32), None) for r in records]
        out = []
        for document, record, n in zip(documents, records, self.lengths(np.asarray(documents)),
                                       strict=True):
            if len(record) != record_bytes(int(n), self.dtype, True):
                raise self._damaged(document, f"a record of {len(record)} bytes for {n} tokens")
            size = int(n) * self.dtype.itemsize
            out.append((np.frombuffer(record[:size], self.dtype).astype(np.int32),
                        np.unpackbits(np.frombuffer(record[size:], np.uint8),
                                      count=int(n)).astype(bool)))
        return out

    def _damaged(self, document: int, why: str) -> UsageError:
        first = np.searchsorted(self._first_documents, document, side="right") - 1
        return UsageError(f"{self.path}: a shard is damaged (reading from "
                          f"{self.shards[first].name} on: {why}); prepare it again")

    def verify_shard(self, number: int) -> int:
        """Read every record of shard ``number`` (ArrayRecord checks each block's hash); its
        token count, or ``UsageError`` naming the shard."""
        from array_record.python.array_record_module import ArrayRecordReader

        shard = self.shards[number]
        try:
            reader = ArrayRecordReader(str(self.path / shard.name))
            try:
                sizes = np.array([len(r) for r in reader.read_all()], np.int64)
            finally:
                reader.close()
        except (OSError, RuntimeError, ValueError) as e:
            raise UsageError(f"{self.path}: shard {shard.name} is damaged ({short(e)}); "
                             f"prepare the dataset again") from None
        first = int(self._first_documents[number])
        lengths = self.lengths(np.arange(first, first + shard.documents))
        expected = record_bytes(lengths, self.dtype, self.loss_mask)
        if len(sizes) != len(lengths) or (sizes != expected).any():
            raise UsageError(f"{self.path}: shard {shard.name} is damaged (its records do not "
                             f"match {INDEX}); prepare the dataset again")
        tokens = int(lengths.sum())
        if tokens != shard.tokens:
            raise UsageError(f"{self.path}: shard {shard.name} holds {tokens} tokens, "
                             f"{shard.tokens} written; prepare the dataset again")
        return tokens

    def _check_files(self) -> None:
        for shard in self.shards:
            file = self.path / shard.name
            if not file.is_file():
                raise UsageError(f"{self.path}: shard {shard.name} is missing; prepare the "
                                 f"dataset again")
            size = file.stat().st_size
            if size != shard.bytes:
                raise UsageError(f"{self.path}: shard {shard.name} is damaged ({size} bytes, "
                                 f"{shard.bytes} written); prepare the dataset again")
        index = self.path / INDEX
        try:
            count = len(self.index)
        except (OSError, ValueError) as e:
            raise UsageError(f"{index} does not read ({e}); prepare the dataset again") from None
        if count != self.num_documents:
            raise UsageError(f"{index} lists {count} documents, metadata.json "
                             f"{self.num_documents}; prepare the dataset again")
        if self.loss_mask:
            hashes = self.path / HASHES
            try:
                count = len(self.hashes)
            except (OSError, ValueError) as e:
                raise UsageError(f"{hashes} does not read ({e}); prepare the dataset again"
                                 ) from None
            if count != self.num_documents:
                raise UsageError(f"{hashes} lists {count} conversations, metadata.json "
                                 f"{self.num_documents}; prepare the dataset again")

    def check_tokenizer(self, name: str, fingerprint: str) -> None:
        """Refuse shards written by another tokenizer than ``fingerprint``'s."""
        recorded = self.tokenizer
        if recorded["fingerprint"] != fingerprint:
            which = (f"{recorded['name']} ({recorded['fingerprint']}), not the experiment's "
                     f"{name} ({fingerprint})" if recorded["name"] == name else
                     f"{recorded['name']}, not the experiment's {name}")
            raise UsageError(
                f"{self.path} was prepared with tokenizer {which}; prepare it again with "
                f"--tokenizer {name} or set the experiment's tokenizer to the dataset's")


def read_metadata(root: Path) -> dict[str, Any]:
    """``root``'s metadata, checked to be a prepared dataset of a version this code reads."""
    file = root / METADATA
    if not file.is_file():
        hint = "its preparation did not finish: run the same pax data prepare again" if (
            root / SHARDS).is_dir() else PREPARE_HINT
        raise UsageError(f"{root} is not a prepared dataset (no {METADATA}; {hint})")
    try:
        metadata = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{file} does not read ({e}); prepare the dataset again") from None
    if not isinstance(metadata, dict) or metadata.get("format") != FORMAT:
        raise UsageError(f"{file} is not a Pax token dataset ({PREPARE_HINT})")
    if metadata.get("version") not in READABLE:
        raise UsageError(f"{file} has format version {metadata.get('version')}; this pax-lm "
                         f"reads versions {', '.join(map(str, READABLE))}: prepare the dataset "
                         f"again")
    needed = ["tokenizer", "dtype", "documents", "tokens", "shards"]
    if metadata.get("loss_mask"):
        needed.append("chat_template")
    missing = [key for key in needed if key not in metadata]
    if missing:
        raise UsageError(f"{file} lacks {', '.join(missing)}; prepare the dataset again")
    if not metadata["documents"]:
        raise UsageError(f"{root} holds no documents; prepare it from a source with text")
    return metadata


def short(error: BaseException) -> str:
    """The first line of a library's error, at most 200 characters: enough to say what."""
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__
