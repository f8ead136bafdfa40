"""Metrics as JSON lines in ``JOB_DIR/metrics.jsonl``: the record scripts and notebooks read.

Each invocation starts with a ``"kind": "start"`` record of the run's settings (including what
MFU is measured against); then come ``train`` and ``eval/<name>`` records.

The file is line buffered, so every record is on disk as soon as it is written. A resumed run
continues the same file, first dropping the records of steps after the checkpoint it resumes
from (the earlier run logged them, then stopped before saving them; they are trained again) and
a line a killed run left unfinished: each step has one record of each kind. In a ``gs://`` job
the object is rewritten whole with each record (an object cannot be appended to).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import Any

from pax_core.files import is_remote, job_path, read_text, write_atomic
from pax_core.loggers.base import Logger


def _json_number(value: float) -> float | None:
    """The value as a float, or None where it is NaN or infinite, which JSON cannot express."""
    value = float(value)
    return value if math.isfinite(value) else None


def _step_of(line: str) -> int | None:
    """The step of a record line, or None for a line that is not one."""
    try:
        step = json.loads(line).get("step")
    except (json.JSONDecodeError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def read_records(job_dir: str) -> list[dict[str, Any]]:
    """The records of a job's ``metrics.jsonl``, each step's latest of each kind (a resumed
    run's repeat of a step replaces the earlier one), lines that do not read skipped (one a
    killed run left unfinished); [] before the first."""
    path = job_path(job_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    latest: dict[tuple[int, str], dict[str, Any]] = {}
    for line in read_text(path).splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if (isinstance(record, dict) and isinstance(record.get("step"), int)
                and isinstance(record.get("kind"), str)):
            latest.pop((record["step"], record["kind"]), None)
            latest[(record["step"], record["kind"])] = record
    return list(latest.values())


class JsonlLogger(Logger):
    """Writes ``{"step": ..., "kind": ..., "time": ..., <metric>: ...}`` per summary."""

    def __init__(self, job_dir: str):
        super().__init__(job_dir)
        root = job_path(job_dir)
        self._remote = is_remote(root)
        if not self._remote:
            root.mkdir(parents=True, exist_ok=True)
        self._path = root / "metrics.jsonl"
        self._file: Any = None
        self._lines: list[str] = []  # a bucket's whole object, rewritten with each record

    def start(self, *, experiment: str, start_step: int, num_train_steps: int,
              hparams: Mapping[str, Any]) -> None:
        self._drop_after(start_step)
        settings = {name: _json_number(value) if isinstance(value, float) else value
                    for name, value in hparams.items()}
        self._append({"step": int(start_step), "kind": "start", "time": time.time(),
                      "num_train_steps": num_train_steps, **settings})

    def write(self, step: int, kind: str, metrics: Mapping[str, float]) -> None:
        record = {"step": int(step), "kind": kind, "time": time.time()}
        record.update((name, _json_number(value)) for name, value in metrics.items())
        self._append(record)

    def _drop_after(self, step: int) -> None:
        """Rewrite the file without the records of steps after ``step`` and unreadable lines."""
        if not self._path.exists():
            return
        lines = read_text(self._path).splitlines()
        kept = [line for line, at in zip(lines, map(_step_of, lines), strict=True)
                if at is not None and at <= step]
        self._lines = kept if self._remote else []
        if len(kept) < len(lines):
            write_atomic(self._path, "".join(line + "\n" for line in kept))

    def _append(self, record: dict[str, Any]) -> None:
        if self._remote:
            self._lines.append(json.dumps(record, allow_nan=False))
            write_atomic(self._path, "".join(line + "\n" for line in self._lines))
            return
        if self._file is None:
            self._file = open(  # noqa: SIM115 (kept open for the run, closed in ``close``)
                self._path, "a", buffering=1, encoding="utf-8")
        self._file.write(json.dumps(record, allow_nan=False) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
