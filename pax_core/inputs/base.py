"""The interface between an input pipeline and the training loop.

An input yields *this process's* share of each global batch as a dict of numpy arrays, and can
report and restore its position as JSON-able state, which is saved inside every checkpoint so that
a resumed run continues with the next batch instead of repeating data.

Global batch ``i`` must be the same rows whatever the number of processes, process ``p`` serving
rows ``[p * local_batch_size, (p + 1) * local_batch_size)`` of it: then N processes train
exactly as one process with the same devices would.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any

import numpy as np

from pax_core.errors import UsageError


@dataclasses.dataclass
class Input(abc.ABC):
    """Base of every input; a dataclass so that experiments configure it with Fiddle.

    ``batch_size`` is the global batch (all processes together). ``eval_num_batches`` is how
    many batches one evaluation reads (-1: until the input is exhausted), as Pax's
    ``eval_loop_num_batches``.
    """

    name: str = "train"
    batch_size: int = 8
    is_training: bool = True
    seed: int = 1234
    eval_num_batches: int = 1

    def __post_init__(self):
        if self.batch_size < 1:
            raise ValueError(f"input '{self.name}': batch_size must be >= 1, got {self.batch_size}")
        if self.eval_num_batches == 0 or self.eval_num_batches < -1:
            raise ValueError(f"input '{self.name}': eval_num_batches must be >= 1 or -1 (until "
                             f"exhausted), got {self.eval_num_batches}")
        self.process_index = 0
        self.process_count = 1

    def shard(self, process_index: int, process_count: int) -> None:
        """Serve only this process's rows of every global batch."""
        if self.batch_size % process_count:
            raise UsageError(f"input '{self.name}': batch_size {self.batch_size} does not divide "
                             f"over {process_count} processes")
        self.process_index, self.process_count = process_index, process_count

    @property
    def local_batch_size(self) -> int:
        return self.batch_size // self.process_count

    def local_rows(self, index: int) -> list[np.random.Generator]:
        """A random generator for each of this process's rows of global batch ``index``, seeded
        by (seed, index, row) only: for inputs that draw their examples at random."""
        first = self.process_index * self.local_batch_size
        return [np.random.default_rng([self.seed, index, row])
                for row in range(first, first + self.local_batch_size)]

    def check(self) -> None:
        """Look at the data now: the run calls this for every input after ``shard`` and before
        it writes anything, so that a missing or bad source stops it at once (planning a run
        skips it). Inputs that open their data lazily override it; raise ``UsageError``."""

    @abc.abstractmethod
    def get_next(self) -> dict[str, np.ndarray]:
        """The next local batch; raises ``StopIteration`` when a finite input is exhausted."""

    @abc.abstractmethod
    def get_state(self) -> dict[str, Any]:
        """The position in the stream, as JSON-able values."""

    @abc.abstractmethod
    def set_state(self, state: dict[str, Any]) -> None:
        """Continue from a position ``get_state`` returned."""

    def reset(self) -> None:
        """Start over (called before every evaluation)."""
        self.set_state(self.initial_state())

    def initial_state(self) -> dict[str, Any]:
        """The state of a fresh input."""
        return {"index": 0}

    def abstract_batch(self) -> dict[str, Any]:
        """Shapes and dtypes of a local batch (``jax.ShapeDtypeStruct``); inputs whose data is
        costly or may be absent (planning a run) override this to answer without reading.

        An input may give batches of several shapes (length buckets): the training loop
        compiles its step once for each shape it meets. It answers its largest shape here,
        the one ``pax plan`` compiles and measures memory with."""
        import jax

        return {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in self.peek().items()}

    def peek(self) -> dict[str, np.ndarray]:
        """The next batch without consuming it (used to learn the batch's shapes)."""
        state = self.get_state()
        batch = self.get_next()
        self.set_state(state)
        return batch
