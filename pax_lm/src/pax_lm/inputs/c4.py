"""C4 as Pax's c4 experiments read it, from where the user keeps it.

Expected: the ``en`` variant in its JSON-lines release (``c4-train.00000-of-01024.json.gz`` ...,
``c4-validation.00000-of-00008.json.gz`` ...) under ``C4_DATA_DIR``, and Pax's C4 SentencePiece
model (``c4_en_301_5Mexp2_spm.model``) at ``C4_SPM_MODEL``. Every shard found is read into memory,
so point ``C4_DATA_DIR`` at the shards to train on; a streaming reader for all of C4 is future
work. Anything missing is one message that says what and where.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pax_core import UsageError
from pax_lm.inputs.corpus import file_documents
from pax_lm.inputs.text import TextInput
from pax_lm.tokenizers import SentencePieceTokenizer

C4_SPLITS = {"train": "train", "validation": "validation"}


@dataclasses.dataclass
class C4Input(TextInput):
    """Every document of the C4 split ``c4_split`` ("train" or "validation"), concatenated and
    split into rows (Pax's reduce_concat), tokenized with the C4 SentencePiece model. C4 has its
    own validation files, so no part of a split is held out (``eval_fraction`` 0)."""

    data_dir: str | None = None
    spm_model: str | None = None
    c4_split: str = "train"
    packing: str = "concat"
    eval_fraction: float = 0.0

    def __post_init__(self):
        if self.c4_split not in C4_SPLITS:
            raise UsageError(f"c4_split must be one of {', '.join(C4_SPLITS)}, "
                             f"got {self.c4_split!r}")
        self.tokenizer = SentencePieceTokenizer(self.spm_model or "")
        super().__post_init__()

    def _spm_model(self) -> str:
        if self.spm_model is None:
            raise UsageError("C4 experiments need Pax's C4 SentencePiece model: --set "
                             "C4_SPM_MODEL=/path/to/c4_en_301_5Mexp2_spm.model")
        if not Path(self.spm_model).is_file():
            raise UsageError(f"C4_SPM_MODEL: no such file {self.spm_model}")
        return self.spm_model

    def _source(self) -> str:
        return f"C4 {self.c4_split} in {self.data_dir}"

    def _load(self):
        self._spm_model()
        return super()._load()

    def _documents(self) -> list[str]:
        if self.data_dir is None:
            raise UsageError("C4 experiments read C4 from a folder you give: --set "
                             "C4_DATA_DIR=/path/to/c4/en (with c4-train.*.json.gz and "
                             "c4-validation.*.json.gz from the C4 'en' release)")
        folder = Path(self.data_dir)
        if not folder.is_dir():
            raise UsageError(f"C4_DATA_DIR: no such folder {folder}")
        pattern = f"c4-{C4_SPLITS[self.c4_split]}.*.json*"
        files = sorted(folder.glob(pattern))
        if not files:
            raise UsageError(f"C4_DATA_DIR {folder} has no {pattern} files (the C4 'en' "
                             f"release's {self.c4_split} shards)")
        return [doc for file in files for doc in file_documents(file)]
