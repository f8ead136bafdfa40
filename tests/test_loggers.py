"""The metric sinks write what other tools read: JSON lines, TensorBoard event files, log lines."""

from __future__ import annotations

import io
import json
import math
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from rich.text import Text
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from pax_core.loggers import LoggerGroup
from pax_core.loggers.base import Logger
from pax_core.loggers.console import ConsoleLogger, format_value
from pax_core.loggers.jsonl import JsonlLogger
from pax_core.loggers.tensorboard import TensorBoardLogger, tag

# Values exact in float32, the precision of TensorBoard scalars, so they compare with ``==``.
HPARAMS = {"learning_rate": 0.125, "model": "mlp|wide"}


def _start(logger, start_step: int = 0) -> None:
    logger.start(experiment="MlpSynthetic", start_step=start_step, num_train_steps=100,
                 hparams=HPARAMS)


def _read_jsonl(job_dir: Path) -> list[dict]:
    # ``parse_constant`` rejects the NaN/Infinity extensions Python would otherwise accept.
    lines = (job_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line, parse_constant=pytest.fail) for line in lines]


def test_jsonl_appends_across_runs(tmp_path):
    before = time.time()
    first = JsonlLogger(str(tmp_path))
    first.write(10, "train", {"loss": 2.5, "learning_rate": 1e-3})
    first.close()
    resumed = JsonlLogger(str(tmp_path))
    resumed.write(20, "eval/test", {"loss": np.float32(1.75)})
    resumed.close()

    records = _read_jsonl(tmp_path)
    assert [{k: v for k, v in r.items() if k != "time"} for r in records] == [
        {"step": 10, "kind": "train", "loss": 2.5, "learning_rate": 1e-3},
        {"step": 20, "kind": "eval/test", "loss": 1.75},
    ]
    assert before <= records[0]["time"] <= records[1]["time"] <= time.time()


def test_jsonl_writes_non_finite_values_as_null(tmp_path):
    logger = JsonlLogger(str(tmp_path))
    logger.write(5, "train", {"loss": math.nan, "grad_norm": math.inf, "low": -math.inf,
                              "ok": 0.5})
    logger.close()

    [record] = _read_jsonl(tmp_path)
    assert (record["loss"], record["grad_norm"], record["low"], record["ok"]) == (
        None, None, None, 0.5)


def _write_tensorboard(job_dir: Path) -> None:
    logger = TensorBoardLogger(str(job_dir))
    _start(logger, start_step=1)
    logger.write(1, "train", {"loss": 2.5, "learning_rate": 0.125})
    logger.write(2, "train", {"loss": 2.25, "learning_rate": 0.125, "steps_per_sec": 10.0,
                              "time_step_ms": 100.0})
    logger.write(2, "eval/test", {"loss": 1.75})
    logger.write(2, "eval/valid", {"loss": 1.5, "accuracy": 0.75})
    logger.text(2, "sample", "hello")
    logger.close()


def _events(run_dir: Path) -> list[event_pb2.Event]:
    """Parse the one TFRecord event file in ``run_dir``, checking both CRCs of each record."""
    [path] = run_dir.glob("events.out.tfevents.*")
    data, pos, events = path.read_bytes(), 0, []
    while pos < len(data):
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        payload = data[pos + 12:pos + 12 + length]
        (payload_crc,) = struct.unpack("<I", data[pos + 12 + length:pos + 16 + length])
        assert (header_crc, payload_crc) == (masked_crc32c(header), masked_crc32c(payload))
        events.append(event_pb2.Event.FromString(payload))
        pos += 16 + length
    return events


def _summaries(run_dir: Path) -> dict[str, list[tuple[int, float | str]]]:
    """Tag -> [(step, scalar or text)] for every summary value in a run."""
    found: dict[str, list[tuple[int, float | str]]] = {}
    for event in _events(run_dir):
        for value in event.summary.value:
            if value.WhichOneof("value") == "simple_value":
                content = value.simple_value
            else:
                content = value.tensor.string_val[0].decode()
            found.setdefault(value.tag, []).append((event.step, content))
    return found


def test_tensorboard_splits_runs_and_records_scalars_and_text(tmp_path):
    _write_tensorboard(tmp_path)

    summaries = tmp_path / "summaries"
    assert sorted(p.name for p in summaries.iterdir() if p.is_dir()) == [
        "eval_test", "eval_valid", "train"]
    assert _summaries(summaries / "train") == {
        "hparams/text_summary": [
            (1, "| name | value |\n| --- | --- |\n| learning_rate | 0.125 |\n"
                "| model | mlp\\|wide |")],
        "train/loss": [(1, 2.5), (2, 2.25)],
        "train/learning_rate": [(1, 0.125), (2, 0.125)],
        "perf/steps_per_sec": [(2, 10.0)],
        "time/step_ms": [(2, 100.0)],
        "sample/text_summary": [(2, "hello")],
    }
    assert _summaries(summaries / "eval_test") == {"eval/loss": [(2, 1.75)]}
    assert _summaries(summaries / "eval_valid") == {"eval/loss": [(2, 1.5)],
                                                    "eval/accuracy": [(2, 0.75)]}


def test_tensorboard_event_files_load_in_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _write_tensorboard(tmp_path)

    train = EventAccumulator(str(tmp_path / "summaries" / "train"))
    train.Reload()
    assert [(e.step, e.value) for e in train.Scalars("train/loss")] == [(1, 2.5), (2, 2.25)]
    valid = EventAccumulator(str(tmp_path / "summaries" / "eval_valid"))
    valid.Reload()
    assert [(e.step, e.value) for e in valid.Scalars("eval/accuracy")] == [(2, 0.75)]


def test_tensorboard_resume_within_the_same_second_keeps_the_earlier_run(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboardX import event_file_writer

    # tensorboardX names event files by the second: both runs below start in the same one.
    monkeypatch.setattr(event_file_writer, "time", SimpleNamespace(time=lambda: 1_800_000_000.0))
    for start_step, steps in ((0, range(1, 5)), (2, range(3, 7))):
        logger = TensorBoardLogger(str(tmp_path))
        _start(logger, start_step)
        for step in steps:
            logger.write(step, "train", {"loss": float(step + start_step)})
        logger.close()

    train = EventAccumulator(str(tmp_path / "summaries" / "train"))
    train.Reload()
    assert [(e.step, e.value) for e in train.Scalars("train/loss")] == [
        (1, 1.0), (2, 2.0), (3, 5.0), (4, 6.0), (5, 7.0), (6, 8.0)]


@pytest.mark.parametrize(("value", "text"), [
    (2.34123, "2.341"), (0.8123, "0.8123"), (12.0, "12"), (1e-5, "1e-05"),
    (123456.0, "1.235e+05"), (math.nan, "nan"),
])
def test_format_value_is_compact(value, text):
    assert format_value(value) == text


def test_console_prints_plain_lines_when_not_a_terminal(tmp_path, capsys, monkeypatch):
    clock = iter([1000.0, 1000.0, 1000.0 + 3725, 1000.0 + 3730])
    monkeypatch.setattr(time, "monotonic", lambda: next(clock))
    logger = ConsoleLogger(str(tmp_path))
    logger.start(experiment="MlpSynthetic", start_step=40, num_train_steps=100,
                 hparams={**HPARAMS, "eval_metric": "eval/test accuracy"})
    logger.progress(41)
    logger.write(50, "train", {"learning_rate": 1e-5, "loss": 2.34123, "steps_per_sec": 0.01})
    logger.progress(51)
    logger.write(50, "eval/test", {"loss": 2.5, "accuracy": 0.625})
    logger.write(60, "train", {"loss": 2.0, "grad_norm": 3.0})
    logger.close()

    # The loss first, the eval metric once evaluated, the time since the start and left.
    assert capsys.readouterr().out.splitlines() == [
        "MlpSynthetic: resuming from step 40 of 100",
        "step 50/100 loss=2.341 steps_per_sec=0.01 elapsed=1:02:05 eta=1:23:20",
        "step 50 eval/test loss=2.5 accuracy=0.625",
        "step 60/100 loss=2 eval/test/accuracy=0.625 elapsed=1:02:10",
    ]


def test_console_verbose_lines_hold_every_metric(tmp_path, capsys):
    logger = ConsoleLogger(str(tmp_path))
    logger.start(experiment="MlpSynthetic", start_step=0, num_train_steps=100,
                 hparams={**HPARAMS, "verbose": True})
    logger.write(50, "train", {"loss": 2.34123, "learning_rate": 1e-5, "steps_per_sec": 12.3})
    assert capsys.readouterr().out.splitlines()[-1] == (
        "step 50 train loss=2.341 learning_rate=1e-05 steps_per_sec=12.3")


@pytest.mark.parametrize(("kind", "name", "expected"), [
    ("train", "loss", "train/loss"), ("train", "grad_norm", "train/grad_norm"),
    ("train", "steps_per_sec", "perf/steps_per_sec"), ("train", "mfu", "perf/mfu"),
    ("train", "model_tflops_per_device", "perf/model_tflops_per_device"),
    ("train", "host_memory_gib", "perf/host_memory_gib"),
    ("train", "time_input_ms", "time/input_ms"), ("eval/test", "loss", "eval/loss"),
    ("eval/valid", "time_ms", "eval/time_ms"),
])
def test_tensorboard_tags_fall_in_four_groups(kind, name, expected):
    assert tag(kind, name) == expected


def test_console_fresh_start_line(tmp_path, capsys):
    _start(ConsoleLogger(str(tmp_path)))
    assert capsys.readouterr().out == "MlpSynthetic: starting at step 0 of 100\n"


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_console_on_a_terminal_shows_a_bar_with_the_latest_train_values(tmp_path, monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    logger = ConsoleLogger(str(tmp_path))
    _start(logger, start_step=40)
    logger.progress(50)
    logger.write(50, "train", {"loss": 2.5, "steps_per_sec": 12.0})
    logger.write(50, "eval/test", {"loss": 1.75})
    logger.close()

    out = Text.from_ansi(terminal.getvalue()).plain
    assert "step 50/100 loss=2.5 steps_per_sec=12 elapsed=" in out
    assert "step 50 eval/test loss=1.75" in out
    assert "step 50/100" in out
    assert "loss 2.5  12 steps/s" in out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


@pytest.mark.slow
def test_tensorboards_hparams_dashboard_compares_the_settings_and_results_of_jobs(tmp_path):
    """Two jobs under one --logdir, read by a real TensorBoard server as its HParams dashboard
    reads them: one session a job, with its settings and its last train loss and eval
    metric; a job that completed or failed ended so, one stopped on request left open."""
    pytest.importorskip("tensorboard")
    jobs = (("fast", 0.5, 100, "completed"), ("slow", 0.125, 50, "interrupted"),
            ("broken", 0.25, 30, "failed"))
    for job, rate, steps, status in jobs:
        logger = TensorBoardLogger(str(tmp_path / job))
        logger.start(experiment="MlpSynthetic", start_step=0, num_train_steps=100,
                     hparams={"learning_rate": rate, "model": "mlp", "eval_metric":
                              "eval/test accuracy"})
        for step in range(10, steps + 1, 10):
            logger.write(step, "train", {"loss": rate * 1000 / step, "steps_per_sec": 5.0})
        logger.write(steps, "eval/test", {"accuracy": rate + 0.25, "loss": 1.0})
        logger.finish(status)
        logger.close()

    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(tmp_path), "--host",
         "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/data/plugin/hparams"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None and time.monotonic() < deadline
            try:
                groups = _post(f"{url}/session_groups", {
                    "experimentName": "", "startIndex": 0, "sliceSize": 10,
                    "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_RUNNING",
                                        "STATUS_FAILURE"],
                    "colParams": []})
                if groups.get("totalSize") == len(jobs):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        experiment = _post(f"{url}/experiment", {"experimentName": ""})
    finally:
        server.terminate()
        server.wait(timeout=30)

    sessions = {g["name"]: g for g in groups["sessionGroups"]}
    assert set(sessions) == {f"{job[0]}/summaries" for job in jobs}
    for job, rate, steps, _ in jobs:
        found = sessions[f"{job}/summaries"]
        assert found["hparams"]["learning_rate"] == rate and found["hparams"]["model"] == "mlp"
        metrics = {(m["name"]["group"], m["name"]["tag"]): (m["trainingStep"], m["value"])
                   for m in found["metricValues"]}
        assert metrics == {("train", "train/loss"): (steps, pytest.approx(rate * 1000 / steps)),
                           ("eval_test", "eval/accuracy"): (steps, rate + 0.25)}
    assert [s["status"] for s in sessions["fast/summaries"]["sessions"]] == ["STATUS_SUCCESS"]
    assert [s["status"] for s in sessions["slow/summaries"]["sessions"]] == ["STATUS_UNKNOWN"]
    assert [s["status"] for s in sessions["broken/summaries"]["sessions"]] == ["STATUS_FAILURE"]
    assert {i["name"]: i["type"] for i in experiment["hparamInfos"]} == {
        "learning_rate": "DATA_TYPE_FLOAT64", "model": "DATA_TYPE_STRING",
        "eval_metric": "DATA_TYPE_STRING"}


class _Failing(Logger):
    """A logger that fails in ``failing`` and counts its calls."""

    def __init__(self, failing: str):
        super().__init__("")
        self.failing, self.calls = failing, []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name == self.failing:
            raise ValueError(f"{name} broke")

    def write(self, step, kind, metrics):
        self._call("write")

    def finish(self, status):
        self._call("finish")

    def close(self):
        self._call("close")


def test_a_failing_logger_is_reported_once_and_still_closed_after_a_failed_finish(capsys):
    writing, finishing, fine = _Failing("write"), _Failing("finish"), _Failing("")
    group = LoggerGroup([writing, finishing, fine])
    group.write(1, "train", {"loss": 1.0})
    group.write(2, "train", {"loss": 1.0})
    group.finish("completed")
    group.close()
    assert writing.calls == ["write"]  # switched off at its first failure
    assert finishing.calls == ["write", "write", "finish", "close"]
    assert fine.calls == ["write", "write", "finish", "close"]
    err = capsys.readouterr().err
    assert "_Failing failed in write and is switched off: ValueError: write broke" in err
    assert "_Failing failed in finish: ValueError: finish broke" in err
