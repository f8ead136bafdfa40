"""Synthetic batches from a seed, so that the loop runs without any modality installed.

Two kinds: ``tokens`` (random ids in Pax's LM field names, as Pax's synthetic LM data: each row
one sequence, so without ``segment_ids`` or ``segment_pos``, which would only say that nothing
is packed: the ids would cost a model its masks and a TPU the segmented attention kernel, the
positions one row's rotary angles for every row, where the model's own ``arange`` shares them) and
``features`` (Gaussian features labelled by a fixed random linear teacher, so a classifier has
something real to learn). Row ``r`` of global batch ``i`` depends only on (seed, i, r): a
process draws only its own rows, the global batch is the same whatever the number of processes,
the position is a single integer and resuming is exact.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from pax_core.inputs.base import Input


@dataclasses.dataclass
class SyntheticInput(Input):
    kind: str = "tokens"
    seq_len: int = 128
    vocab_size: int = 32000
    feature_dim: int = 16
    num_classes: int = 4
    teacher_seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.kind not in ("tokens", "features"):
            raise ValueError(
                f"SyntheticInput.kind must be 'tokens' or 'features', got {self.kind!r}"
            )
        self.index = 0
        teacher = np.random.default_rng(self.teacher_seed)
        self._teacher = teacher.standard_normal((self.feature_dim, self.num_classes))

    def get_next(self) -> dict[str, np.ndarray]:
        rows = self.local_rows(self.index)
        self.index += 1
        n = len(rows)
        if self.kind == "features":
            x = np.stack([r.standard_normal(self.feature_dim) for r in rows]).astype(np.float32)
            return {"features": x, "labels": np.argmax(x @ self._teacher, -1).astype(np.int32)}
        ids = np.stack([r.integers(0, self.vocab_size, self.seq_len + 1, dtype=np.int32)
                        for r in rows])
        ones = np.ones((n, self.seq_len), np.float32)
        return {
            "ids": ids[:, :-1],
            "labels": ids[:, 1:],
            "weights": ones,
        }

    def get_state(self) -> dict[str, Any]:
        return {"index": self.index}

    def set_state(self, state: dict[str, Any]) -> None:
        self.index = int(state["index"])
