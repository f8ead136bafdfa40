"""The metric sinks write what other tools read: JSON lines, TensorBoard event files, log lines."""

from __future__ import annotations

import io
import json
import math
import struct
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from rich.text import Text
from tensorboardX.proto import event_pb2
from tensorboardX.record_writer import masked_crc32c

from pax_core.loggers.console import ConsoleLogger, format_value
from pax_core.loggers.jsonl import JsonlLogger
from pax_core.loggers.tensorboard import TensorBoardLogger

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
    logger.write(2, "train", {"loss": 2.25, "learning_rate": 0.125})
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
    assert sorted(p.name for p in summaries.iterdir()) == ["eval_test", "eval_valid", "train"]
    assert _summaries(summaries / "train") == {
        "hparams/text_summary": [
            (1, "| name | value |\n| --- | --- |\n| learning_rate | 0.125 |\n"
                "| model | mlp\\|wide |")],
        "loss": [(1, 2.5), (2, 2.25)],
        "learning_rate": [(1, 0.125), (2, 0.125)],
        "sample/text_summary": [(2, "hello")],
    }
    assert _summaries(summaries / "eval_test") == {"loss": [(2, 1.75)]}
    assert _summaries(summaries / "eval_valid") == {"loss": [(2, 1.5)], "accuracy": [(2, 0.75)]}


def test_tensorboard_event_files_load_in_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _write_tensorboard(tmp_path)

    train = EventAccumulator(str(tmp_path / "summaries" / "train"))
    train.Reload()
    assert [(e.step, e.value) for e in train.Scalars("loss")] == [(1, 2.5), (2, 2.25)]
    valid = EventAccumulator(str(tmp_path / "summaries" / "eval_valid"))
    valid.Reload()
    assert [(e.step, e.value) for e in valid.Scalars("accuracy")] == [(2, 0.75)]


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
    assert [(e.step, e.value) for e in train.Scalars("loss")] == [
        (1, 1.0), (2, 2.0), (3, 5.0), (4, 6.0), (5, 7.0), (6, 8.0)]


@pytest.mark.parametrize(("value", "text"), [
    (2.34123, "2.341"), (0.8123, "0.8123"), (12.0, "12"), (1e-5, "1e-05"),
    (123456.0, "1.235e+05"), (math.nan, "nan"),
])
def test_format_value_is_compact(value, text):
    assert format_value(value) == text


def test_console_prints_plain_lines_when_not_a_terminal(tmp_path, capsys):
    logger = ConsoleLogger(str(tmp_path))
    _start(logger, start_step=40)
    logger.progress(41)
    logger.write(50, "train", {"loss": 2.34123, "learning_rate": 1e-5, "steps_per_sec": 12.3})
    logger.progress(51)
    logger.write(50, "eval/test", {"loss": 2.5})
    logger.close()

    assert capsys.readouterr().out.splitlines() == [
        "MlpSynthetic: resuming from step 40 of 100",
        "step 50 train loss=2.341 learning_rate=1e-05 steps_per_sec=12.3",
        "step 50 eval/test loss=2.5",
    ]


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
    assert "step 50 train loss=2.5 steps_per_sec=12" in out
    assert "step 50 eval/test loss=1.75" in out
    assert "step 50/100" in out
    assert "loss 2.5  12 steps/s" in out
