"""Token sequences that count up with a stride: easy to learn, impossible to guess."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from pax_core import Input


@dataclasses.dataclass
class CountingInput(Input):
    """Rows ``s, s+k, s+2k, ... (mod vocab_size)`` with random start ``s`` and stride ``k``.

    Each row is drawn from (seed, batch index, row), so a process makes only its own rows and the
    global batch does not depend on the number of processes.
    """

    seq_len: int = 16
    vocab_size: int = 32
    max_stride: int = 3

    def __post_init__(self):
        super().__post_init__()
        self.index = 0

    def get_next(self) -> dict[str, np.ndarray]:
        rows = self.local_rows(self.index)
        self.index += 1
        n = len(rows)
        start = np.array([[r.integers(0, self.vocab_size)] for r in rows])
        stride = np.array([[r.integers(1, self.max_stride + 1)] for r in rows])
        ids = ((start + stride * np.arange(self.seq_len + 1)) % self.vocab_size).astype(np.int32)
        return {"ids": ids[:, :-1], "labels": ids[:, 1:],
                "weights": np.ones((n, self.seq_len), np.float32)}

    def get_state(self) -> dict[str, Any]:
        return {"index": self.index}

    def set_state(self, state: dict[str, Any]) -> None:
        self.index = int(state["index"])
