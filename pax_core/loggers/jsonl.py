"""Metrics as JSON lines in ``JOB_DIR/metrics.jsonl``: the record scripts and notebooks read.

Each invocation starts with a ``"kind": "start"`` record of the run's settings (including what
MFU is measured against); then come ``train`` and ``eval/<name>`` records.

The file is opened for appending, so a resumed run continues the same file, and it is line
buffered, so every record is on disk as soon as it is written and a crash loses at most one line.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from typing import Any

from pax_core.loggers.base import Logger


def _json_number(value: float) -> float | None:
    """The value as a float, or None where it is NaN or infinite, which JSON cannot express."""
    value = float(value)
    return value if math.isfinite(value) else None


class JsonlLogger(Logger):
    """Writes ``{"step": ..., "kind": ..., "time": ..., <metric>: ...}`` per summary."""

    def __init__(self, job_dir: str):
        super().__init__(job_dir)
        os.makedirs(job_dir, exist_ok=True)
        self._file = open(  # noqa: SIM115 (kept open for the whole run, closed in ``close``)
            os.path.join(job_dir, "metrics.jsonl"), "a", buffering=1, encoding="utf-8"
        )

    def start(self, *, experiment: str, start_step: int, num_train_steps: int,
              hparams: Mapping[str, Any]) -> None:
        settings = {name: _json_number(value) if isinstance(value, float) else value
                    for name, value in hparams.items()}
        self._append({"step": int(start_step), "kind": "start", "time": time.time(),
                      "num_train_steps": num_train_steps, **settings})

    def write(self, step: int, kind: str, metrics: Mapping[str, float]) -> None:
        record = {"step": int(step), "kind": kind, "time": time.time()}
        record.update((name, _json_number(value)) for name, value in metrics.items())
        self._append(record)

    def _append(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, allow_nan=False) + "\n")

    def close(self) -> None:
        self._file.close()
