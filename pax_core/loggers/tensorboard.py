"""Metrics as TensorBoard event files under ``JOB_DIR/summaries``, written by tensorboardX.

tensorboardX writes the event format without TensorFlow. Each kind of summary gets its own run
directory (``train``, ``eval_<name>``), and each metric a tag in one of four groups, which
TensorBoard shows as sections: ``train/`` (the loss, the learning rate, what the model
reports), ``eval/`` (every eval dataset's metrics, the datasets told apart by run), ``perf/``
(speed, utilisation, memory) and ``time/`` (where a step's time went).

The run's settings go to TensorBoard's HParams dashboard: the job's ``summaries`` folder is one
session (its start info there, its end info written as the training ends), whose metrics are
the train loss and the eval metric, found in the ``train`` and ``eval_<name>`` runs below it;
runs of several jobs under one ``--logdir`` compare in one table. The settings are also written as a
text table in the ``train`` run, which shows them whole.

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
from tensorboardX.proto import api_pb2, plugin_hparams_pb2
from tensorboardX.proto.event_pb2 import Event, SessionLog
from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata
from tensorboardX.record_writer import directory_check

from pax_core.files import is_remote
from pax_core.loggers.base import Logger, watched_metric

REMOTE_FLUSH_SEC = 30.0
SESSION = "."  # the HParams session's run: the summaries folder itself
SESSION_ENDS = {"completed": "STATUS_SUCCESS", "failed": "STATUS_FAILURE"}
# Train metrics of the perf/ group (besides those named *_per_sec, *_gib and *flops*).
PERF = frozenset({"mfu", "hfu", "first_step_sec", "startup_sec"})


def tag(kind: str, name: str) -> str:
    """The TensorBoard tag of metric ``name`` of a summary of ``kind``."""
    if kind != "train":
        return f"eval/{name}"
    if name.startswith("time_"):
        return f"time/{name.removeprefix('time_')}"
    if name in PERF or name.endswith(("_per_sec", "_gib")) or "flops" in name:
        return f"perf/{name}"
    return f"train/{name}"


def _hparams_summary(tag_name: str, data: plugin_hparams_pb2.HParamsPluginData) -> Summary:
    data.version = 0
    metadata = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(
        plugin_name="hparams", content=data.SerializeToString()))
    return Summary(value=[Summary.Value(tag=tag_name, metadata=metadata)])


def _session_start(hparams: Mapping[str, Any], metrics: list[tuple[str, str]]
                   ) -> list[Summary]:
    """The HParams experiment (the settings and the metrics, each metric's run as its group)
    and this session's start: the settings' values. Numbers stay numbers; anything else is
    shown as text."""
    start = plugin_hparams_pb2.SessionStartInfo(start_time_secs=time.time())
    infos = []
    for name, value in hparams.items():
        if isinstance(value, bool):
            start.hparams[name].bool_value, kind = value, "DATA_TYPE_BOOL"
        elif isinstance(value, int | float):
            start.hparams[name].number_value, kind = float(value), "DATA_TYPE_FLOAT64"
        else:
            start.hparams[name].string_value, kind = str(value), "DATA_TYPE_STRING"
        infos.append(api_pb2.HParamInfo(name=name, type=api_pb2.DataType.Value(kind)))
    experiment = api_pb2.Experiment(hparam_infos=infos, metric_infos=[
        api_pb2.MetricInfo(name=api_pb2.MetricName(group=group, tag=name))
        for group, name in metrics])
    return [_hparams_summary("_hparams_/experiment",
                             plugin_hparams_pb2.HParamsPluginData(experiment=experiment)),
            _hparams_summary("_hparams_/session_start_info",
                             plugin_hparams_pb2.HParamsPluginData(session_start_info=start))]


def _session_end(status: str) -> Summary:
    end = plugin_hparams_pb2.SessionEndInfo(status=api_pb2.Status.Value(status),
                                            end_time_secs=time.time())
    return _hparams_summary("_hparams_/session_end_info",
                            plugin_hparams_pb2.HParamsPluginData(session_end_info=end))


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
        self._step = 0  # the last step written: where the session ends

    def _writer(self, kind: str) -> EventsWriter:
        run = kind.replace("/", "_")  # ``train`` stays, ``eval/test`` becomes ``eval_test``
        if run not in self._writers:
            folder = os.path.join(self.job_dir, "summaries", *([] if run == SESSION else [run]))
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
        self._purge_step, self._step = start_step + 1, start_step
        metrics = [("train", "train/loss")]
        if (watched := watched_metric(hparams)) is not None:
            kind, name = watched
            metrics.append((kind.replace("/", "_"), tag(kind, name)))
        self._write(SESSION, start_step, _session_start(hparams, metrics))
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
        self._step = max(self._step, step)
        self._write(kind, step, [summary.scalar(tag(kind, name), float(value))
                                 for name, value in metrics.items()])

    def text(self, step: int, tag: str, text: str) -> None:
        self._write("train", step, [summary.text(tag, text)])

    def finish(self, status: str) -> None:
        # A session stopped on request stays open: the job resumes it.
        if SESSION in self._writers and status in SESSION_ENDS:
            self._write(SESSION, self._step, [_session_end(SESSION_ENDS[status])])

    def close(self) -> None:
        writers, self._writers = list(self._writers.values()), {}
        for writer in writers:
            writer.close()
