"""What pax-lm's inputs share: a tokenizer, rows of ``seq_len`` next-token predictions laid out
by ``pax_lm.inputs.packing``, shuffling and repetition that follow ``is_training``, and the batch
every LM input yields."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from pax_core import Input, UsageError
from pax_lm.inputs.packing import PACKINGS
from pax_lm.tokenizers import ByteTokenizer, Tokenizer

# The batch: [local batch, seq_len] each; weights are 0 on padding.
KEYS = ("ids", "labels", "segment_ids", "segment_pos", "weights")


@dataclasses.dataclass
class LmInput(Input):
    """Base of the LM inputs. ``shuffle`` and ``repeat`` default to ``is_training``."""

    tokenizer: Any = dataclasses.field(default_factory=ByteTokenizer)
    seq_len: int = 256
    packing: str = "pack"
    shuffle: bool | None = None
    repeat: bool | None = None

    def __post_init__(self):
        super().__post_init__()
        self._check_fields()

    def _check_fields(self) -> None:
        """Refuse impossible settings when the config is built (subclasses add theirs)."""
        where = f"input '{self.name}'"
        if self.seq_len < 2:
            raise UsageError(f"{where}: seq_len must be >= 2, got {self.seq_len}")
        if self.packing not in PACKINGS:
            raise UsageError(f"{where}: packing must be one of {', '.join(PACKINGS)}, "
                             f"got {self.packing!r}")
        if not isinstance(self.tokenizer, Tokenizer):
            raise UsageError(f"{where}: tokenizer must be a pax_lm.tokenizers.Tokenizer, "
                             f"got {type(self.tokenizer).__name__}")

    @property
    def _shuffles(self) -> bool:
        return self.is_training if self.shuffle is None else self.shuffle

    @property
    def _repeats(self) -> bool:
        return self.is_training if self.repeat is None else self.repeat

    def abstract_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
        shape = (self.local_batch_size, self.seq_len)
        return {k: jax.ShapeDtypeStruct(shape, np.float32 if k == "weights" else np.int32)
                for k in KEYS}
