"""Metrics on stdout: a live progress bar on a terminal, plain flushed lines anywhere else.

A log file or a batch scheduler wants one self-contained line per summary with no control codes,
so the mode is chosen once, from ``sys.stdout.isatty()``, when the logger is built.

A train summary's line holds what a person watching the run looks for, in a fixed order: the
step out of the total, the loss, the model's eval metric as last evaluated, steps/s, the time
since training started and the time it should still take. Every other metric goes to the JSON
lines and TensorBoard, or onto the line too with ``pax train --verbose`` (the ``verbose``
setting in the run's ``hparams``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any

from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from pax_core.loggers.base import Logger, watched_metric


def format_value(value: float) -> str:
    """Four significant digits; the ``g`` format turns scientific only for tiny or huge values."""
    return f"{value:.4g}"


def format_duration(seconds: float) -> str:
    """``1:02:03`` (hours, minutes, seconds)."""
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def format_line(step: int, kind: str, metrics: Mapping[str, float]) -> str:
    """One summary as ``step 100 train loss=2.341 ...``: easy to read and to grep."""
    values = " ".join(f"{name}={format_value(value)}" for name, value in metrics.items())
    return f"step {step} {kind} {values}"


def speed_line(hparams: Mapping[str, Any]) -> str | None:
    """What MFU and HFU are measured against, from the run's settings (``pax_core.speed.clock``)."""
    if "peak_source" not in hparams:
        return None
    peak, model, hardware = (hparams[k] for k in ("peak_tflops_per_device",
                                                    "model_flops_per_step",
                                                    "hardware_flops_per_step"))
    against = f"{format_value(peak)} TFLOP/s per device ({hparams['peak_source']})" \
        if peak is not None else f"no peak FLOP/s ({hparams['peak_source']}; set --peak-tflops)"
    model_text = (f"{format_value(model)} by formula {hparams['flops_formula']}"
                  if model is not None else "unknown (the model has no FLOP formula)")
    hardware_text = format_value(hardware) if hardware is not None else "unknown"
    return (f"speed: MFU and HFU against {against}; model FLOPs per step {model_text}, "
            f"hardware FLOPs per step {hardware_text} by XLA cost analysis")


def run_summary(name: str, step: int, total: int, seconds: float,
                train: Mapping[str, float], evals: Mapping[str, Mapping[str, float]],
                checkpoint: str, job_dir: str, tensorboard: bool) -> list[str]:
    """The lines that end a run: where it got to and how long it took, its last loss and eval
    results, its checkpoint, and how to look at it."""
    lines = [f"{name}: trained to step {step} of {total} in {format_duration(seconds)}"]
    if "loss" in train:
        lines.append(f"  train loss={format_value(train['loss'])}")
    lines += [f"  eval/{dataset} " + " ".join(f"{k}={format_value(v)}" for k, v in metrics.items())
              for dataset, metrics in evals.items()]
    lines.append(f"  checkpoint: {checkpoint}")
    looks = [f"pax plot {job_dir} --output loss.png"]
    if tensorboard:
        looks.insert(0, f"tensorboard --logdir {job_dir}/summaries")
    lines.append(f"  see the run: {', or '.join(looks)}")
    return lines


class _LatestColumn(ProgressColumn):
    """The last reported loss and speed; blank until the first train summary brings them."""

    def render(self, task: Task) -> Text:
        parts = []
        if (loss := task.fields.get("loss")) is not None:
            parts.append(f"loss {format_value(loss)}")
        if (speed := task.fields.get("steps_per_sec")) is not None:
            parts.append(f"{format_value(speed)} steps/s")
        return Text("  ".join(parts))


class ConsoleLogger(Logger):
    """Shows progress and summaries on stdout."""

    def __init__(self, job_dir: str):
        super().__init__(job_dir)
        # A disabled bar draws nothing, so ``progress`` needs no branch for the plain mode.
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("step {task.completed}/{task.total}"),
            _LatestColumn(),
            TimeRemainingColumn(),
            disable=not sys.stdout.isatty(),
        )
        self._task = self._bar.add_task("", start=False, loss=None, steps_per_sec=None)
        self._total, self._started, self._verbose = 0, time.monotonic(), False
        # The eval metric the step lines show (its kind and name) and its last value.
        self._watched: tuple[str, str] | None = None
        self._evaluated: float | None = None

    def start(self, *, experiment: str, start_step: int, num_train_steps: int,
              hparams: Mapping[str, Any]) -> None:
        self._total, self._started = num_train_steps, time.monotonic()
        self._verbose = bool(hparams.get("verbose"))
        self._watched = watched_metric(hparams)
        where = f"resuming from step {start_step}" if start_step > 0 else "starting at step 0"
        self._print(f"{experiment}: {where} of {num_train_steps}")
        if (line := speed_line(hparams)) is not None:
            self._print(line)
        if "placement" in hparams:
            self._print(f"placement: {hparams['placement']}")
        for line in hparams.get("presets", []):
            self._print(f"preset {line}")
        for line in hparams.get("fitted", []):
            self._print(f"fitted {line}")
        # ``reset`` rather than ``update`` so the steps restored from a checkpoint do not count
        # towards the speed behind the time remaining.
        self._bar.reset(self._task, total=num_train_steps, completed=start_step,
                        description=experiment)
        self._bar.start()

    def progress(self, step: int) -> None:
        self._bar.update(self._task, completed=step)

    def write(self, step: int, kind: str, metrics: Mapping[str, float]) -> None:
        if self._watched is not None and kind == self._watched[0]:
            self._evaluated = metrics.get(self._watched[1], self._evaluated)
        if kind != "train":
            self._print(format_line(step, kind, metrics))
            return
        latest = {name: metrics[name] for name in ("loss", "steps_per_sec") if name in metrics}
        self._bar.update(self._task, **latest)
        self._print(format_line(step, kind, metrics) if self._verbose
                    else self._step_line(step, metrics))

    def _step_line(self, step: int, metrics: Mapping[str, float]) -> str:
        """``step 120/200 loss=0.41 eval/test/accuracy=0.9 steps_per_sec=185 elapsed=0:00:02
        eta=0:00:00``; a value not known yet is left out."""
        parts = [f"step {step}/{self._total}"]
        if "loss" in metrics:
            parts.append(f"loss={format_value(metrics['loss'])}")
        if self._watched is not None and self._evaluated is not None:
            parts.append(f"{'/'.join(self._watched)}={format_value(self._evaluated)}")
        speed = metrics.get("steps_per_sec")
        if speed is not None:
            parts.append(f"steps_per_sec={format_value(speed)}")
        parts.append(f"elapsed={format_duration(time.monotonic() - self._started)}")
        if speed:
            parts.append(f"eta={format_duration(max(self._total - step, 0) / speed)}")
        return " ".join(parts)

    def close(self) -> None:
        self._bar.stop()

    def _print(self, line: str) -> None:
        if self._bar.disable:
            print(line, flush=True)
        else:
            # Printed through the bar's console, the line lands above the bar instead of in it.
            self._bar.console.print(line, markup=False)
