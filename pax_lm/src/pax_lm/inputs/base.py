"""What pax-lm's inputs share: a tokenizer, rows of ``seq_len`` next-token predictions laid out
by ``pax_lm.inputs.packing``, and the batch every LM input yields; order, position and workers
are the core's ``IndexedInput``."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

from pax_core import IndexedInput, UsageError
from pax_lm.inputs.packing import PACKINGS
from pax_lm.tokenizers import ByteTokenizer, Tokenizer

# The batch: [local batch, seq_len] each; weights are 0 on padding.
KEYS = ("ids", "labels", "segment_ids", "segment_pos", "weights")


@dataclasses.dataclass
class LmInput(IndexedInput):
    """Base of the LM inputs."""

    tokenizer: Any = dataclasses.field(default_factory=ByteTokenizer)
    seq_len: int = 256
    packing: str = "pack"

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

    def abstract_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
        shape = (self.local_batch_size, self.seq_len)
        return {k: jax.ShapeDtypeStruct(shape, np.float32 if k == "weights" else np.int32)
                for k in KEYS}
