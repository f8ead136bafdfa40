"""Metrics as TensorBoard event files under ``JOB_DIR/summaries``, written by tensorboardX.

tensorboardX writes the event format without TensorFlow. Each kind of summary gets its own run
directory (``train``, ``eval_<name>``), so TensorBoard draws train and eval curves of the same
metric name on one chart, told apart by run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from tensorboardX import SummaryWriter

from pax_core.loggers.base import Logger


def _escape(value: Any) -> str:
    """The value as table cell text; a bare ``|`` would end the cell."""
    return str(value).replace("|", r"\|")


def _markdown_table(hparams: Mapping[str, Any]) -> str:
    """The settings as a two-column table, which TensorBoard's text tab renders as markdown."""
    rows = [f"| {name} | {_escape(value)} |" for name, value in hparams.items()]
    return "\n".join(["| name | value |", "| --- | --- |", *rows])


class TensorBoardLogger(Logger):
    """One ``SummaryWriter`` per run directory, created when that run first has something."""

    def __init__(self, job_dir: str):
        super().__init__(job_dir)
        self._writers: dict[str, SummaryWriter] = {}
        self._purge_step: int | None = None

    def _writer(self, kind: str) -> SummaryWriter:
        run = kind.replace("/", "_")  # ``train`` stays, ``eval/test`` becomes ``eval_test``
        if run not in self._writers:
            # The event file's name carries the time in seconds only: a resume started within
            # the same second would overwrite the earlier run's file without a finer suffix,
            # which also keeps the files in the order they were written.
            self._writers[run] = SummaryWriter(os.path.join(self.job_dir, "summaries", run),
                                               purge_step=self._purge_step,
                                               filename_suffix=f".{time.time_ns():020d}")
        return self._writers[run]

    def start(self, *, experiment: str, start_step: int, num_train_steps: int,
              hparams: Mapping[str, Any]) -> None:
        # A resumed run trains again the steps after its checkpoint: TensorBoard hides what an
        # earlier run logged for them.
        self._purge_step = start_step + 1
        # As text, not ``add_hparams``, which would put them in a timestamped run of their own.
        self.text(start_step, "hparams", _markdown_table(hparams))

    def write(self, step: int, kind: str, metrics: Mapping[str, float]) -> None:
        writer = self._writer(kind)
        for name, value in metrics.items():
            writer.add_scalar(name, float(value), global_step=step)

    def text(self, step: int, tag: str, text: str) -> None:
        self._writer("train").add_text(tag, text, global_step=step)

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()  # flushes what is queued first
        self._writers.clear()
