"""A trial's metrics, read from its job's ``metrics.jsonl`` (as ``pax train`` wrote them)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pax_sweep.space import metric_parts

_NOT_METRICS = ("step", "kind", "time")


def records(job_dir: Path) -> Iterator[dict[str, Any]]:
    """The records of a job's ``metrics.jsonl`` (none before its first); an unfinished last
    line is skipped."""
    path = job_dir / "metrics.jsonl"
    if not path.exists():
        return
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and "kind" in entry and "step" in entry:
            yield entry


def curve(job_dir: Path, metric: str) -> list[tuple[int, float]]:
    """(step, value) of ``metric`` (``KIND NAME``) through a trial's run, one value per step (a
    resumed run's repeat replaces the earlier one)."""
    return _read(job_dir, metric)[0]


def final(job_dir: Path, metric: str) -> tuple[float | None, int | None]:
    """A trial's last value of ``metric`` and its last train step."""
    points, last_step = _read(job_dir, metric)
    return (points[-1][1] if points else None), last_step


def _read(job_dir: Path, metric: str) -> tuple[list[tuple[int, float]], int | None]:
    """The metric's curve and the last train step, in one pass over the file."""
    kind, name = metric_parts(metric)
    points: dict[int, float] = {}
    last_step = None
    for entry in records(job_dir):
        if entry["kind"] == "train":
            last_step = int(entry["step"])
        if entry["kind"] == kind and isinstance(entry.get(name), int | float):
            points[int(entry["step"])] = float(entry[name])
    return sorted(points.items()), last_step


def reported(job_dir: Path) -> list[str]:
    """Every metric a trial reports, as ``KIND NAME``."""
    return sorted({f"{e['kind']} {key}" for e in records(job_dir) if e["kind"] != "start"
                   for key in e if key not in _NOT_METRICS})
