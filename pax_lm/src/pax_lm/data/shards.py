"""Prepared token datasets: the directory ``pax data prepare`` writes and the inputs read.

::

    DIR/
      metadata.json   what the directory holds: format and version, the tokenizer (name,
                      vocabulary size, fingerprint of its model file), the token dtype, counts,
                      the shards (name, documents, tokens, bytes) and the sources (path, bytes,
                      SHA-256)
      index.npy       the token count of every document, in shard order (4 bytes a document,
                      memory-mapped): what a batch planner reads, so that it never reads tokens
      shards/tokens-00000.array_record, ...
                      ArrayRecord files, one record per document: its token ids (no bos or
                      eos) as little-endian integers of the token dtype

``metadata.json`` is written last, so a directory without it is not (yet) a dataset. Opening one
checks what a run would otherwise trip over later: the files, their sizes, the index length.
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
VERSION = 1
METADATA = "metadata.json"
INDEX = "index.npy"
SHARDS = "shards"
# One record per group: a document is read without decompressing its neighbours (random access).
WRITER_OPTIONS = "group_size:1"
PREPARE_HINT = "make one with: pax data prepare SRC --output DIR"


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned type that holds every id: 2 bytes a token for vocabularies up to
    65,536 (C4's 32k SentencePiece model, GPT-2's 50k), else 4."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def shard_name(number: int) -> str:
    return f"{SHARDS}/tokens-{number:05d}.array_record"


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
    def open(cls, path: str | Path) -> PreparedDataset:
        """Open ``path``, or raise ``UsageError`` naming what is missing or damaged."""
        root = Path(path)
        if not root.is_dir():
            raise UsageError(f"no such data directory: {root} ({PREPARE_HINT})")
        metadata = read_metadata(root)
        dataset = cls(root, metadata)
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
    def fingerprint(self) -> str:
        """Changes when the documents do: the tokenizer's and every shard's record."""
        return json.dumps([self.tokenizer["fingerprint"], self.metadata["shards"]])

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

    def tokens(self, documents: list[int]) -> list[np.ndarray]:
        """The token ids of ``documents``, read together (ArrayRecord reads them in parallel)."""
        try:
            records = self._source.__getitems__(documents)
        except (RuntimeError, ValueError) as e:  # the C++ reader's status, as text
            first = np.searchsorted(self._first_documents, min(documents), side="right") - 1
            raise UsageError(f"{self.path}: a shard is damaged (reading from "
                             f"{self.shards[first].name} on: {short(e)}); prepare it again"
                             ) from None
        return [np.frombuffer(r, self.dtype).astype(np.int32) for r in records]

    def verify_shard(self, number: int) -> int:
        """Read every record of shard ``number`` (ArrayRecord checks each block's hash); its
        token count, or ``UsageError`` naming the shard."""
        from array_record.python.array_record_module import ArrayRecordReader

        shard = self.shards[number]
        try:
            reader = ArrayRecordReader(str(self.path / shard.name))
            try:
                tokens = sum(len(r) for r in reader.read_all()) // self.dtype.itemsize
            finally:
                reader.close()
        except (OSError, RuntimeError, ValueError) as e:
            raise UsageError(f"{self.path}: shard {shard.name} is damaged ({short(e)}); "
                             f"prepare the dataset again") from None
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
    if metadata.get("version") != VERSION:
        raise UsageError(f"{file} has format version {metadata.get('version')}; this pax-lm "
                         f"reads version {VERSION}: prepare the dataset again")
    missing = [key for key in ("tokenizer", "dtype", "documents", "tokens", "shards")
               if key not in metadata]
    if missing:
        raise UsageError(f"{file} lacks {', '.join(missing)}; prepare the dataset again")
    if not metadata["documents"]:
        raise UsageError(f"{root} holds no documents; prepare it from a source with text")
    return metadata


def short(error: BaseException) -> str:
    """The first line of a library's error, at most 200 characters: enough to say what."""
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__
