"""The sweep directory: what a sweep is, and each trial's record beside its job.

Layout: ``sweep.json`` (the experiment, its ``--set`` items, the search space, the algorithm
and its seed: what makes two invocations the same sweep; and the latest metric, goal and
budget), ``trials/NNN/`` (each a normal job directory, with ``trial.json``: the choice as DNA
and as ``--set`` items, the status, the metric, steps and wall time, and ``output.log``: what
its ``pax train`` printed), ``sweep.lock`` while a sweep runs, and what ``--show`` writes
(``results.csv``, ``results.png``). Every file is replaced whole, so a sweep killed at any
moment resumes from what it finds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pax_core import UsageError, held, write_atomic

# A trial's statuses: ``running`` (started, not ended: an interrupted trial resumes from its
# checkpoint), ``completed``, ``stopped early`` (by the early-stopping rule: its metric is the
# last it reached), ``failed`` (its run failed: no metric), ``invalid`` (``pax train`` refused
# its values: left out). Only ``running`` trials are started again by the next invocation.
RUNNING, COMPLETED, STOPPED_EARLY = "running", "completed", "stopped early"
FAILED, INVALID = "failed", "invalid"
IDENTITY = ("experiment", "set_items", "search", "algorithm", "seed")


@dataclasses.dataclass
class Trial:
    """One trial: its number, the choice (PyGlove's DNA as JSON, and as ``--set`` items) and
    what became of it."""

    id: int
    dna: Any
    overrides: list[str]
    status: str = RUNNING
    metric: float | None = None
    steps: int | None = None
    wall_sec: float = 0.0
    message: str = ""

    @property
    def name(self) -> str:
        return f"{self.id:03d}"


class SweepDir:
    """A sweep directory (local)."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser().resolve()

    @property
    def trials_dir(self) -> Path:
        return self.path / "trials"

    def job_dir(self, trial: Trial) -> Path:
        return self.trials_dir / trial.name

    def definition(self) -> dict[str, Any] | None:
        """``sweep.json``, or None in a new directory."""
        path = self.path / "sweep.json"
        if not path.exists():
            return None
        try:
            definition = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise UsageError(f"{path} does not read ({e}); it defines the sweep in "
                             f"{self.path}: repair it, or use another --sweep-dir") from None
        if not isinstance(definition, dict) or any(k not in definition for k in IDENTITY):
            raise UsageError(f"{path} is not a pax sweep's record; use another --sweep-dir")
        return definition

    def check_same_sweep(self, definition: dict[str, Any]) -> None:
        """Refuse a directory that holds a different sweep, naming the first difference."""
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"--sweep-dir {self.path} is a file; give a folder (nothing was "
                             f"changed)")
        if self.path.exists() and not (self.path / "sweep.json").exists() and any(
                p.name != "sweep.lock" for p in self.path.iterdir()):
            raise UsageError(f"--sweep-dir {self.path} is not empty and holds no sweep; use an "
                             f"empty or new folder (nothing was changed)")
        recorded = self.definition()
        if recorded is None:
            return
        for key in IDENTITY:
            if recorded[key] != definition[key]:
                raise UsageError(
                    f"--sweep-dir {self.path} holds another sweep ({key}: "
                    f"{_short(recorded[key])}, not {_short(definition[key])}); rerun its own "
                    f"command to resume it, or use another --sweep-dir (nothing was changed)")

    def write_definition(self, definition: dict[str, Any]) -> None:
        self.trials_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path / "sweep.json", json.dumps(definition, indent=1) + "\n")

    def trials(self) -> list[Trial]:
        """Every recorded trial, by number."""
        out = []
        for path in self.trials_dir.glob("*/trial.json"):
            try:
                out.append(Trial(**json.loads(path.read_text(encoding="utf-8"))))
            except (OSError, json.JSONDecodeError, TypeError) as e:
                raise UsageError(f"{path} does not read ({e}); it is the JSON pax sweep wrote "
                                 f"for that trial: repair it, then run again") from None
        return sorted(out, key=lambda t: t.id)

    def save(self, trial: Trial) -> None:
        folder = self.job_dir(trial)
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / "trial.json", json.dumps(dataclasses.asdict(trial)) + "\n")

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """One ``pax sweep`` at a time in a sweep directory."""
        self.path.mkdir(parents=True, exist_ok=True)
        with held(self.path / "sweep.lock", lambda holder: UsageError(
                f"--sweep-dir {self.path} is in use by another pax sweep ({holder}); wait for "
                f"it to end, stop it, or use another --sweep-dir (nothing was changed)")):
            yield


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."
