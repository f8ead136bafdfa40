"""The job directory: what a run leaves behind, and the guards that keep it whole.

Layout (Pax's): ``config.json`` (Fiddle serialization) and ``config.txt`` (one ``path = value``
per line) of the latest invocation, ``runs.jsonl`` (one line per invocation: command line,
overrides, plugins and library versions), ``checkpoints/``, ``metrics.jsonl``, ``summaries/``
(TensorBoard), and ``train.lock`` while a ``pax train`` runs in it.

Every file is replaced whole (written beside, then renamed), so a run killed at any moment
leaves either the old file or the new one; the lock is the operating system's (``flock``),
which a killed process releases, so it never has to be removed by hand. A ``gs://`` job
directory has the same files; a bucket has no lock a killed process releases, so there one run
at a time is the user's to keep (``pax_core.files``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pax_core.checkpointers.integrity import RECORD
from pax_core.errors import PaxError, UsageError, first_line, warn
from pax_core.files import held, is_remote, job_path, probe_write, read_text, write_atomic
from pax_core.plugins.versions import library_versions

RUN_KEYS = ("experiment", "overrides")


def _damaged(path: Path, line: int, what: str) -> UsageError:
    return UsageError(f"{path} is damaged: line {line} {what}; it records the earlier runs of "
                      f"this job (the checkpoints do not depend on it): repair or delete that "
                      f"line, then run again (nothing was changed)")


def _parse_run(path: Path, number: int, line: str) -> dict[str, Any]:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError:
        raise _damaged(path, number, "is not JSON") from None
    if not isinstance(entry, dict):
        raise _damaged(path, number, "is not a JSON object")
    for key in RUN_KEYS:
        if key not in entry:
            raise _damaged(path, number, f"has no '{key}'")
    if not isinstance(entry["experiment"], str) or not isinstance(entry["overrides"], list):
        raise _damaged(path, number, "has an 'experiment' or 'overrides' of the wrong type")
    return entry


def _settings(config_text: str) -> dict[str, str]:
    """``path = value`` lines of a ``config.txt`` (comments skipped)."""
    pairs = (line.partition(" = ") for line in config_text.splitlines()
             if line and not line.startswith("#"))
    return {path: value for path, eq, value in pairs if eq}


class JobDir:
    """One run's directory; several invocations of the same experiment share it (resume)."""

    def __init__(self, path: str | os.PathLike):
        self.path = job_path(path)
        self.remote = is_remote(self.path)
        if not self.remote and self.path.exists() and not self.path.is_dir():
            raise UsageError(f"--job-dir {self.path} exists and is not a directory")

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def runs_file(self) -> Path:
        return self.path / "runs.jsonl"

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Whatever the storage raises while the record is read (a bucket out of reach, no
        rights to it) becomes one line naming the job directory."""
        try:
            yield
        except PaxError:
            raise
        except Exception as e:
            what = first_line(e)
            where = "the bucket name, your credentials and the network" if self.remote else \
                "that it is readable"
            raise UsageError(f"--job-dir {self.path} cannot be read ({what}); check {where} "
                             f"(nothing was changed)") from None

    def has_checkpoints(self) -> bool:
        """Whether a step was saved here: a step folder (named by its number). A save that
        never completed (a temporary folder left by a run that failed or was killed) is not
        one, so it neither makes a job of a directory whose record was lost nor stands for a
        trained model."""
        with self._reading():
            return self.checkpoints.is_dir() and any(
                path.name.isdigit() for path in self.checkpoints.iterdir())

    def began_saving(self) -> bool:
        """Whether anything was written under ``checkpoints/``, a save that never completed
        included: what tells "no complete checkpoint" from "no checkpoint"."""
        with self._reading():
            return self.checkpoints.is_dir() and any(self.checkpoints.iterdir())

    def create(self) -> None:
        """Create the directory, or say clearly why it cannot be written."""
        if self.remote:
            self._check_bucket()
            return
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--job-dir {self.path} cannot be created: {e.strerror}") from e
        for path in (self.path, self.checkpoints):
            if path.exists() and not os.access(path, os.W_OK | os.X_OK):
                raise UsageError(f"{path} is not writable; make it writable (or use another "
                                 f"--job-dir), then run the same command (nothing was changed)")

    def _check_bucket(self) -> None:
        """Write and remove one object, so that a missing bucket or missing rights are told
        before the run starts rather than at its first checkpoint."""
        failed = probe_write(self.path)
        if failed is not None:
            raise UsageError(f"--job-dir {self.path} cannot be written ({first_line(failed)}); "
                             f"check the bucket name and your credentials (nothing was changed)")

    def runs(self) -> list[dict[str, Any]]:
        """The recorded invocations, oldest first; a damaged record is a ``UsageError`` naming
        the file and the line."""
        with self._reading():
            if not self.runs_file.exists():
                return []
            lines = read_text(self.runs_file).splitlines()
        return [_parse_run(self.runs_file, n, line) for n, line in enumerate(lines, 1)
                if line.strip()]

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
            if not self._saved_by_pax():
                raise UsageError(f"--job-dir {self.path} has checkpoints but no runs.jsonl; it "
                                 f"was not written by pax train, use another --job-dir")
            # The record went (the job directory removed under a run, whose next save made it
            # again): the steps are a pax run's, and a restore checks that they fit.
            warn(f"--job-dir {self.path} has checkpoints but no runs.jsonl (its record was "
                 f"removed); resuming from them as a run of {experiment}")

    def _saved_by_pax(self) -> bool:
        """Whether a step here carries pax's checksum record, which only a pax run writes."""
        with self._reading():
            return any((path / RECORD).is_file() for path in self.checkpoints.iterdir()
                       if path.name.isdigit())

    def changed_settings(self, config_text: str) -> list[str]:
        """``path: old -> new`` for every setting that differs from the previous invocation's
        ``config.txt`` (none when there is no readable one)."""
        try:
            before = _settings((self.path / "config.txt").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            return []
        now = _settings(config_text)
        return [f"{path}: {before.get(path, '(absent)')} -> {now.get(path, '(absent)')}"
                for path in sorted(set(before) | set(now)) if before.get(path) != now.get(path)]

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Hold ``train.lock`` for one ``pax train``; a second one in the same directory is a
        ``UsageError`` naming the first (its process id, host and start time). In a bucket
        there is no such lock: nothing is held."""
        if self.remote:
            yield
            return
        with held(self.path / "train.lock", lambda holder: UsageError(
                f"--job-dir {self.path} is in use by another pax train ({holder}); wait for it "
                f"to end, stop it, or use another --job-dir (nothing was changed)")):
            yield

    @property
    def target_file(self) -> Path:
        return self.path / "target_reached.json"

    def record_target(self, early: Any, step: int, reached: str) -> None:
        """Note that the run reached its early-stopping target at ``step``."""
        write_atomic(self.target_file, json.dumps(
            {"step": step, "reached": reached, "metric": early.metric, "dataset": early.dataset,
             "target": early.target, "higher_is_better": early.higher_is_better}) + "\n")

    def target_reached(self, early: Any, step: int) -> str | None:
        """What an earlier run reached, when it stopped at ``step`` on the same target; None
        when there is no such record (or it does not read: the run then trains on)."""
        if early is None or not self.target_file.exists():
            return None
        try:
            noted = json.loads(self.target_file.read_text(encoding="utf-8"))
            same = (noted["step"], noted["metric"], noted["dataset"], noted["target"],
                    noted["higher_is_better"]) == (step, early.metric, early.dataset,
                                                   early.target, early.higher_is_better)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return noted.get("reached", "its target") if same else None

    def record(self, *, experiment: str, overrides: list[str], config_json: str,
               config_text: str, plugins: dict[str, str], extra: dict[str, Any] | None = None
               ) -> None:
        """Write the config and add this invocation to ``runs.jsonl``."""
        write_atomic(self.path / "config.json", config_json)
        write_atomic(self.path / "config.txt", config_text)
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "experiment": experiment,
            "overrides": overrides,
            "argv": sys.argv,
            "plugins": plugins,
            "versions": library_versions(),
            **(extra or {}),
        }
        earlier = self.runs_file.read_text(encoding="utf-8") if self.runs_file.exists() else ""
        write_atomic(self.runs_file, earlier + json.dumps(entry) + "\n")
