"""Seeded, index-addressed inputs on grain: the machinery every modality's data input shares.

A resume bug costs the most of any input bug (a run silently sees some data twice and some
never), so the parts that decide *which rows a batch holds* and *where a run continues* live
here once:

* **Order.** ``shuffle`` and ``repeat`` default to ``is_training``; ``example_order`` is the
  seeded order of a source's examples (a new permutation every epoch).
* **Rows.** Global batch ``k`` is the same rows whatever the process count; process ``p``
  reads rows ``process_rows()`` of it and nothing else.
* **Workers.** With ``num_workers`` > 0 a repeating input is read by grain's ``mp_prefetch``,
  worker ``w`` of ``W`` assembling batches ``w, w + W, ...``, so the batches are the same for
  any number of workers. (A finite input, an evaluation, is read in this process: workers
  would start anew at every evaluation.)
* **Position.** Each batch carries the position after it; ``get_state`` is that position and
  the data key (``KEY_NAME``: a fingerprint of the data and of the settings that decide the
  batches). A position of other data or settings is refused with a ``UsageError`` naming what
  to do (it would name other rows); a value that is no position at all is a ``ValueError``,
  which the run treats as a damaged checkpoint.

A modality supplies three things: its data key, how many batches a finite input holds, and a
reader of global batch ``k`` (a picklable callable, since grain's workers run it). An input whose
rows are planned in sequence rather than addressed by index (pax-lm's packed token rows)
overrides ``stream`` and the position hooks instead, and keeps the rest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pax_core.errors import UsageError
from pax_core.inputs.base import Input

if TYPE_CHECKING:
    import grain

_WORKER_BUFFER = 2  # batches each worker process keeps ready


def fingerprint(*parts: Any) -> str:
    """A short, stable hash of JSON-able ``parts`` (others by ``str``): a data key, or a
    source's identity within one."""
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:16]


@dataclasses.dataclass
class IndexedInput(Input):
    """Base of inputs whose global batch ``k`` is decided by their data, settings and ``k``.

    ``shuffle`` and ``repeat`` default to ``is_training``; ``num_workers`` prefetching
    processes read a repeating input (0: this process reads).

    A subclass gives ``data_key``, ``num_batches`` (when not repeating) and ``batch_reader``.
    It may act on what its reader reports beside the arrays (a skipped file) in ``received``,
    and say in ``CHANGED`` what a refused position's data key covers.
    """

    KEY_NAME: ClassVar[str] = "data"  # the data key's name in the saved position
    POSITION: ClassVar[str] = "_position"  # the key under which a streamed batch carries it
    # Batches read ahead, each by a thread of its own (0 for data in memory, where threads only
    # contend for the GIL). A few: grain's default reads 500 elements ahead, and an element
    # here is a whole batch (at ImageNet's 512 images of 224 x 224, tens of gigabytes).
    READ_AHEAD: ClassVar[int] = 4
    CHANGED: ClassVar[str] = "the data, seed, batch_size, shuffle or repeat"

    shuffle: bool | None = None
    repeat: bool | None = None
    num_workers: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.num_workers < 0:
            raise UsageError(f"input '{self.name}': num_workers must be >= 0, got "
                             f"{self.num_workers}")
        self._iterator: Any = None
        self._position: dict[str, Any] | None = None  # None: the start, nothing read yet

    # What a modality supplies.

    def data_key(self) -> str:
        """What decides which rows each batch holds (``fingerprint`` of the data's identity
        and the settings): equal keys, equal batches."""
        raise NotImplementedError(f"{type(self).__name__} must define data_key()")

    def num_batches(self) -> int:
        """How many global batches a finite (not repeating) input holds; its last batch is
        filled with weight-0 rows, so that every example counts once."""
        raise NotImplementedError(f"{type(self).__name__} must define num_batches()")

    def batch_reader(self) -> Callable[[int], dict[str, Any]]:
        """Global batch ``k`` -> this process's rows of it (``process_rows``), as a dict of
        arrays. Picklable, as grain's worker processes run it: a module-level class holding
        what it reads, not a bound method of the input."""
        raise NotImplementedError(f"{type(self).__name__} must define batch_reader()")

    def received(self, batch: dict[str, Any], peeking: bool) -> dict[str, np.ndarray]:
        """The batch the loop gets from what the reader returned: a reader that reports more
        than arrays (files it skipped) has it acted on here, once per batch read
        (``peeking``: the batch is only looked at, and will be read again)."""
        return batch

    # Shared parts a subclass builds with.

    @property
    def shuffles(self) -> bool:
        return self.is_training if self.shuffle is None else self.shuffle

    @property
    def repeats(self) -> bool:
        return self.is_training if self.repeat is None else self.repeat

    def process_rows(self) -> slice:
        """This process's rows of every global batch."""
        first = self.process_index * self.local_batch_size
        return slice(first, first + self.local_batch_size)

    def example_order(self, num_examples: int, seed: int | None = None) -> grain.MapDataset:
        """Example numbers in stream order: shuffled by ``seed`` (default the input's) with a
        new permutation every epoch when ``shuffles``, repeated forever when ``repeats``."""
        import grain

        order = grain.MapDataset.range(num_examples)
        if self.shuffles:
            order = order.shuffle(seed=(self.seed if seed is None else seed) % 2**32)
        return order.repeat() if self.repeats else order

    def finite_batches(self, num_examples: int) -> int:
        """Global batches that hold ``num_examples`` examples once."""
        return math.ceil(num_examples / self.batch_size)

    # The stream and its position.

    def stream(self, position: dict[str, Any], workers: bool) -> grain.IterDataset:
        """The batches from ``position`` on, each carrying the position after it under
        ``POSITION``; ``workers``: may be read by worker processes."""
        import grain

        first = position["batches"]
        end = sys.maxsize if self.repeats else self.num_batches()
        options = grain.ReadOptions(num_threads=self.READ_AHEAD,
                                    prefetch_buffer_size=self.READ_AHEAD)
        batches = (grain.MapDataset.range(first, max(first, end))
                   .map(_Numbered(self.batch_reader())).to_iter_dataset(options))
        return self.prefetched(batches) if workers else batches

    def prefetched(self, batches: grain.IterDataset) -> grain.IterDataset:
        """``batches`` read by ``num_workers`` worker processes, when this input repeats."""
        if not (self.num_workers and self.repeats):
            return batches
        import grain
        from absl import flags

        if not flags.FLAGS.is_parsed():  # grain's workers read absl flags, which only
            flags.FLAGS.mark_as_parsed()  # absl's own app.run parses
        return batches.mp_prefetch(grain.MultiprocessingOptions(
            num_workers=self.num_workers, per_worker_buffer_size=_WORKER_BUFFER))

    def first_position(self) -> dict[str, Any]:
        """The position of a fresh input (without the data key)."""
        return {"batches": 0}

    def read_position(self, state: Any) -> dict[str, Any]:
        """The position in a saved ``state`` (without the data key); ``ValueError`` when it is
        not a position of this kind of input."""
        if not isinstance(state, dict) or not isinstance(state.get("batches"), int):
            raise ValueError(f"not a position of {type(self).__name__}: {state!r}")
        return {"batches": state["batches"]}

    def what_changed(self, saved_key: str) -> str:
        """What differs when a saved position's data key is not this input's."""
        del saved_key
        return self.CHANGED

    # The Input interface.

    def get_next(self) -> dict[str, np.ndarray]:
        if self._iterator is None:
            self._iterator = iter(self.stream(self._current(), workers=True))
        batch = dict(next(self._iterator))
        self._position = _plain(batch.pop(self.POSITION))
        return self.received(batch, peeking=False)

    def peek(self) -> dict[str, np.ndarray]:
        batch = dict(next(iter(self.stream(self._current(), workers=False))))
        batch.pop(self.POSITION)
        return self.received(batch, peeking=True)

    def get_state(self) -> dict[str, Any]:
        return {**self._current(), self.KEY_NAME: self.data_key()}

    def set_state(self, state: dict[str, Any]) -> None:
        position = self.read_position(state)
        saved, key = state.get(self.KEY_NAME), self.data_key()
        if saved != key:
            raise UsageError(f"input '{self.name}': the checkpoint's input position was read "
                             f"from other data or settings ({self.what_changed(str(saved))} "
                             f"changed since); restore them, or train in a new job directory")
        self.close()
        self._position = position

    def initial_state(self) -> dict[str, Any]:
        return {**self.first_position(), self.KEY_NAME: self.data_key()}

    def shard(self, process_index: int, process_count: int) -> None:
        super().shard(process_index, process_count)
        self.close()  # another process reads other rows

    def _current(self) -> dict[str, Any]:
        return dict(self._position) if self._position is not None else self.first_position()

    def close(self) -> None:
        """Stop reading: the worker processes end, and the next read starts a new stream."""
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()  # mp_prefetch's worker processes
        self._iterator = None


class _Numbered:
    """A reader whose batches carry the position after them (picklable, for the workers)."""

    def __init__(self, reader: Callable[[int], dict[str, Any]]):
        self.reader = reader

    def __call__(self, k: int) -> dict[str, Any]:
        return {**self.reader(k), IndexedInput.POSITION: {"batches": np.int64(k + 1)}}


def _plain(position: dict[str, Any]) -> dict[str, Any]:
    """A carried position as JSON-able Python values (numpy scalars and arrays converted)."""
    return {k: v.tolist() if hasattr(v, "tolist") else v for k, v in position.items()}
