"""A text dataset in TFDS's ArrayRecord layout, read as it is: tokenized while it is read.

``tfds build`` writes a split as ``NAME-SPLIT.array_record-00000-of-NNNNN`` files, one serialized
``tf.train.Example`` per record (C4's ``c4/en``: ``text``, ``url``, ``timestamp``). grain's
``ArrayRecordDataSource`` gives random access to the records of all files in order, so document
``i`` here is document ``i`` of ``pax data prepare`` over the same files.

There is no index of lengths: the batch planner asks for the lengths of a block of documents at
once, which tokenizes them (SentencePiece and Hugging Face tokenizers use several threads for a
list), and the tokens are kept for the reads of the batch's rows that follow. Every process
plans every global batch, so every process tokenizes the whole stream; preparing the dataset
once (``pax data prepare``) saves that work for large runs.
"""

from __future__ import annotations

import collections
import functools
from pathlib import Path
from typing import Any

import numpy as np

from pax_core import UsageError
from pax_lm.data import tf_example
from pax_lm.data.shards import short
from pax_lm.tokenizers import Tokenizer

# Documents whose tokens are kept: several planning blocks, so that a batch's rows find theirs.
_KEPT = 16384


class TfdsText:
    """The documents of ``files`` (TFDS ArrayRecord files of one split), the bytes feature
    ``field`` of each record tokenized with ``tokenizer``. Picklable (input workers)."""

    def __init__(self, files: list[Path], tokenizer: Tokenizer, field: str = "text"):
        if not files:
            raise UsageError("no TFDS ArrayRecord files given")
        self.files, self.tokenizer, self.field = [Path(f) for f in files], tokenizer, field
        self._kept: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()

    def __getstate__(self) -> dict[str, Any]:
        return {"files": self.files, "tokenizer": self.tokenizer, "field": self.field}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(**state)

    @functools.cached_property
    def _source(self) -> Any:
        import grain

        try:
            return grain.sources.ArrayRecordDataSource([str(f) for f in self.files])
        except (OSError, RuntimeError, ValueError) as e:
            raise UsageError(f"cannot open {self.files[0].parent} as TFDS ArrayRecord files "
                             f"({short(e)})") from None

    @property
    def fingerprint(self) -> str:
        """Changes when the files or the tokenizer do (names, sizes and modification times)."""
        files = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in self.files]
        return repr([self.tokenizer.fingerprint, self.field, files])

    @property
    def num_documents(self) -> int:
        return len(self._source)

    def lengths(self, documents: np.ndarray) -> np.ndarray:
        return np.array([len(ids) for ids in self.tokens(list(map(int, documents)))], np.int64)

    def tokens(self, documents: list[int]) -> list[np.ndarray]:
        missing = sorted({d for d in documents if d not in self._kept})
        if missing:
            records = self._source.__getitems__(missing)
            texts = [tf_example.text_feature(r, self.field, f"{self.files[0].parent} #{d}")
                     for d, r in zip(missing, records, strict=True)]
            for document, ids in zip(missing, self.tokenizer.encode_batch(texts), strict=True):
                self._kept[document] = np.asarray(ids, np.int32)
        for document in documents:
            self._kept.move_to_end(document)
        out = [self._kept[d] for d in documents]
        while len(self._kept) > _KEPT:
            self._kept.popitem(last=False)
        return out
