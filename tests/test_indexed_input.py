"""``IndexedInput``'s stream: how far it reads ahead of the loop."""

from __future__ import annotations

import dataclasses
import threading
import time

import numpy as np

from pax_core import IndexedInput, fingerprint

_READ: list[int] = []
_LOCK = threading.Lock()


class _CountingReader:
    """Batch ``k`` as one row holding ``k``; notes every batch it is asked for."""

    def __call__(self, k: int) -> dict[str, np.ndarray]:
        with _LOCK:
            _READ.append(k)
        return {"k": np.full((1, 1), k, np.int32)}


@dataclasses.dataclass
class _Counted(IndexedInput):
    def data_key(self) -> str:
        return fingerprint("counted")

    def num_batches(self) -> int:
        return 10_000

    def batch_reader(self) -> _CountingReader:
        return _CountingReader()


def test_the_stream_reads_only_a_few_batches_ahead_of_the_loop():
    """An element of the stream is a whole batch: read-ahead is counted in batches, a few,
    not grain's default of hundreds of elements (which at ImageNet's batch would be tens of
    gigabytes held in memory)."""
    _READ.clear()
    data = _Counted(name="counted", batch_size=1, is_training=False)
    assert [int(data.get_next()["k"][0, 0]) for _ in range(3)] == [0, 1, 2]
    time.sleep(1.0)  # time for the threads to read as far ahead as they are allowed
    with _LOCK:
        read = max(_READ)
    assert read <= 2 + _Counted.READ_AHEAD + 1, read
    data.close()
