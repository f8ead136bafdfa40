"""The job directory: what a run leaves behind, and the guard against mixing two runs in one.

Layout (Pax's): ``config.json`` (Fiddle serialization) and ``config.txt`` (one ``path = value``
per line) of the latest invocation, ``runs.jsonl`` (one line per invocation: command line,
overrides, plugins and library versions), ``checkpoints/``, ``metrics.jsonl``, ``summaries/``
(TensorBoard).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from pax_core.errors import UsageError

LIBRARIES = ("pax-core", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "fiddle")


def library_versions() -> dict[str, str]:
    out = {}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class JobDir:
    """One run's directory; several invocations of the same experiment share it (resume)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser().resolve()
        if self.path.exists() and not self.path.is_dir():
            raise UsageError(f"--job-dir {self.path} exists and is not a directory")

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def has_checkpoints(self) -> bool:
        return self.checkpoints.is_dir() and any(self.checkpoints.iterdir())

    def create(self) -> None:
        """Create the directory, or say clearly why it cannot be written."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--job-dir {self.path} cannot be created: {e.strerror}") from e
        if not os.access(self.path, os.W_OK | os.X_OK):
            raise UsageError(f"--job-dir {self.path} is not writable")

    def runs(self) -> list[dict[str, Any]]:
        log = self.path / "runs.jsonl"
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]

    def last_run(self) -> dict[str, Any] | None:
        runs = self.runs()
        return runs[-1] if runs else None

    def check_same_experiment(self, experiment: str) -> None:
        """Refuse to resume a job directory that holds a different experiment."""
        last = self.last_run()
        if last is not None and last["experiment"] != experiment:
            raise UsageError(
                f"--job-dir {self.path} holds a run of {last['experiment']}, not {experiment}; "
                f"use another --job-dir (nothing was changed)"
            )
        if last is None and self.has_checkpoints():
            raise UsageError(f"--job-dir {self.path} has checkpoints but no runs.jsonl; it was "
                             f"not written by pax train, use another --job-dir")

    def record(self, *, experiment: str, overrides: list[str], config_json: str,
               config_text: str, plugins: dict[str, str], extra: dict[str, Any] | None = None
               ) -> None:
        """Write the config and append this invocation to ``runs.jsonl``."""
        _write_atomic(self.path / "config.json", config_json)
        _write_atomic(self.path / "config.txt", config_text)
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "experiment": experiment,
            "overrides": overrides,
            "argv": sys.argv,
            "plugins": plugins,
            "versions": library_versions(),
            **(extra or {}),
        }
        with open(self.path / "runs.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")
