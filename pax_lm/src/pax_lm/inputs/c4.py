"""C4 as Pax's c4 experiments read it, streamed from where the user keeps it.

``C4_DATA_DIR`` holds either

* TFDS's ``c4/en`` ArrayRecord layout (``c4-train.array_record-00000-of-01024``, ...), read as
  it is and tokenized while it is read (``pax_lm.data.tfds``), or
* one prepared dataset per split, ``train/`` and ``validation/`` (``pax data prepare``), which
  spares every run the tokenizing.

C4's JSON-lines release (``c4-train.00000-of-01024.json.gz``) has no random access: a folder of
it is answered with the ``pax data prepare`` commands that turn it into the second layout. The
tokenizer is Pax's C4 SentencePiece model (``c4_en_301_5Mexp2_spm.model``) at ``C4_SPM_MODEL``.
Anything missing is one message that says what and where.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pax_core import UsageError, tfds_split_files
from pax_lm.data import shards
from pax_lm.data.shards import PreparedDataset
from pax_lm.data.tfds import TfdsText
from pax_lm.inputs.tokens import TokensInput, TokenSource
from pax_lm.tokenizers import SentencePieceTokenizer

C4_SPLITS = ("train", "validation")
_JSON_FILES = "c4-{split}.*.json*"


@dataclasses.dataclass
class C4Input(TokensInput):
    """The C4 split ``c4_split`` ("train" or "validation") from ``data_dir``, concatenated and
    split into rows (Pax's reduce_concat) by default."""

    data_dir: str | None = None
    spm_model: str | None = None
    c4_split: str = "train"
    packing: str = "concat"

    def __post_init__(self):
        if self.c4_split not in C4_SPLITS:
            raise UsageError(f"c4_split must be one of {', '.join(C4_SPLITS)}, "
                             f"got {self.c4_split!r}")
        self.tokenizer = SentencePieceTokenizer(self.spm_model or "")
        super().__post_init__()

    def _open_datasets(self) -> list[TokenSource]:
        if self.spm_model is None:
            raise UsageError("C4 experiments need Pax's C4 SentencePiece model: --set "
                             "C4_SPM_MODEL=/path/to/c4_en_301_5Mexp2_spm.model")
        if not Path(self.spm_model).is_file():
            raise UsageError(f"C4_SPM_MODEL: no such file {self.spm_model}")
        if self.data_dir is None:
            raise UsageError("C4 experiments read C4 from a folder you give: --set "
                             "C4_DATA_DIR=/path/to/c4/en/3.1.0 (TFDS's ArrayRecord files) or a "
                             "folder of train/ and validation/ made by pax data prepare")
        folder = Path(self.data_dir)
        if not folder.is_dir():
            raise UsageError(f"C4_DATA_DIR: no such folder {folder}")
        if (folder / self.c4_split / shards.METADATA).is_file():
            data = PreparedDataset.open(folder / self.c4_split)
            data.check_tokenizer(self.tokenizer.name, self.tokenizer.fingerprint)
            return [data]
        files = tfds_split_files(folder, self.c4_split)
        if files:
            return [TfdsText(files, self.tokenizer)]
        raise UsageError(self._missing_split(folder))

    def _missing_split(self, folder: Path) -> str:
        if any(folder.glob(_JSON_FILES.format(split=self.c4_split))):
            return (f"C4_DATA_DIR {folder} holds C4's JSON release, which has no random access: "
                    f"prepare it once with {prepare_commands(folder, self.spm_model)} and set "
                    f"C4_DATA_DIR to that folder")
        return (f"C4_DATA_DIR {folder} has neither TFDS's c4-{self.c4_split}.array_record-* "
                f"files nor a prepared {self.c4_split}/ split (pax data prepare)")


def prepare_commands(source: Path, spm_model: str | None) -> str:
    """The ``pax data prepare`` commands that make a ``C4_DATA_DIR`` from C4's JSON release."""
    output = source.parent / "c4_prepared"
    return " and ".join(
        f"pax data prepare {source} --pattern '{_JSON_FILES.format(split=split)}' "
        f"--tokenizer {spm_model} --output {output / split}" for split in C4_SPLITS)
