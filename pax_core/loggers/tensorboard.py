"""Metrics as TensorBoard event files under ``JOB_DIR/summaries``, written by tensorboardX.

tensorboardX writes the event format without TensorFlow. Each kind of summary gets its own run
directory (``train``, ``eval_<name>``), so TensorBoard draws train and eval curves of the same
metric name on one chart, told apart by run.

The events are written and flushed in the calling thread, at each summary (a few lines every
``summary_interval_steps``; in a bucket, where a flush uploads the file again, every
``REMOTE_FLUSH_SEC`` at most), through tensorboardX's ``EventsWriter``, rather than by its
``SummaryWriter``, which hands them to a writer thread through a bounded queue: when storage
fails (a full disk) that thread dies, and the run would block for ever on the queue, or at exit
on the queue's feeder thread. Here the failure is an ``OSError`` where the metrics are written,
which the loop reports and stops on.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from tensorboardX import summary
from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.record_writer import directory_check

from pax_core.files import is_remote
from pax_core.loggers.base import Logger

REMOTE_FLUSH_SEC = 30.0


def _escape(value: Any) -> str:
    """The value as table cell text; a bare ``|`` would end the cell."""
    return str(value).replace("|", r"\|")


def _markdown_table(hparams: Mapping[str, Any]) -> str:
    """The settings as a two-column table, which TensorBoard's text tab renders as markdown."""
    rows = [f"| {name} | {_escape(value)} |" for name, value in hparams.items()]
    return "\n".join(["| name | value |", "| --- | --- |", *rows])


class TensorBoardLogger(Logger):
    """One event file per run directory, created when that run first has something."""

    def __init__(self, job_dir: str):
        super().__init__(job_dir)
        self._writers: dict[str, EventsWriter] = {}
        self._flushed: dict[str, float] = {}
        self._purge_step: int | None = None

    def _writer(self, kind: str) -> EventsWriter:
        run = kind.replace("/", "_")  # ``train`` stays, ``eval/test`` becomes ``eval_test``
        if run not in self._writers:
            folder = os.path.join(self.job_dir, "summaries", run)
            directory_check(folder)
            # The event file's name carries the time in seconds only: a resume started within
            # the same second would overwrite the earlier run's file without a finer suffix,
            # which also keeps the files in the order they were written.
            writer = EventsWriter(os.path.join(folder, "events"),
                                  filename_suffix=f".{time.time_ns():020d}")
            if self._purge_step is not None:
                # TensorBoard hides what earlier files logged from this step on.
                writer.write_event(Event(step=self._purge_step, wall_time=time.time(),
                                         session_log=SessionLog(status=SessionLog.START)))
            self._writers[run] = writer
        return self._writers[run]

    def start(self, *, experiment: str, start_step: int, num_train_steps: int,
              hparams: Mapping[str, Any]) -> None:
        # A resumed run trains again the steps after its checkpoint: TensorBoard hides what an
        # earlier run logged for them.
        self._purge_step = start_step + 1
        # As text, not as hparams, which TensorBoard would put in a timestamped run of its own.
        self.text(start_step, "hparams", _markdown_table(hparams))

    def _write(self, kind: str, step: int, summaries: list[Any]) -> None:
        writer, now = self._writer(kind), time.time()
        for one in summaries:
            writer.write_event(Event(wall_time=now, step=step, summary=one))
        # In a bucket a flush uploads the whole file again: there, at most every
        # REMOTE_FLUSH_SEC (and at close).
        if not is_remote(self.job_dir) or now - self._flushed.get(kind, 0.0) >= REMOTE_FLUSH_SEC:
            writer.flush()
            self._flushed[kind] = now

    def write(self, step: int, kind: str, metrics: Mapping[str, float]) -> None:
        self._write(kind, step, [summary.scalar(name, float(value))
                                 for name, value in metrics.items()])

    def text(self, step: int, tag: str, text: str) -> None:
        self._write("train", step, [summary.text(tag, text)])

    def close(self) -> None:
        writers, self._writers = list(self._writers.values()), {}
        for writer in writers:
            writer.close()
