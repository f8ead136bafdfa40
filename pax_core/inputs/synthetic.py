"""Synthetic batches from a seed, so that the loop runs without any modality installed.

Two kinds: ``tokens`` (random ids in Pax's LM field names, as Pax's synthetic LM data) and
``features`` (Gaussian features labelled by a fixed random linear teacher, so a classifier has
something real to learn). Batch ``i`` depends only on (seed, i, process), so the position is a
single integer and resuming is exact.
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
        rng = np.random.default_rng([self.seed, self.index, self.process_index])
        self.index += 1
        n = self.local_batch_size
        if self.kind == "features":
            x = rng.standard_normal((n, self.feature_dim)).astype(np.float32)
            return {"features": x, "labels": np.argmax(x @ self._teacher, -1).astype(np.int32)}
        ids = rng.integers(0, self.vocab_size, (n, self.seq_len + 1), dtype=np.int32)
        ones = np.ones((n, self.seq_len), np.float32)
        return {
            "ids": ids[:, :-1],
            "labels": ids[:, 1:],
            "weights": ones,
            "segment_ids": ones.astype(np.int32),
            "segment_pos": np.tile(np.arange(self.seq_len, dtype=np.int32), (n, 1)),
        }

    def get_state(self) -> dict[str, Any]:
        return {"index": self.index}

    def set_state(self, state: dict[str, Any]) -> None:
        self.index = int(state["index"])
