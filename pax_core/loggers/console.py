"""Metrics on stdout: a live progress bar on a terminal, plain flushed lines anywhere else.

A log file or a batch scheduler wants one self-contained line per summary with no control codes,
so the mode is chosen once, from ``sys.stdout.isatty()``, when the logger is built.
"""

from __future__ import annotations

import sys
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

from pax_core.loggers.base import Logger


def format_value(value: float) -> str:
    """Four significant digits; the ``g`` format turns scientific only for tiny or huge values."""
    return f"{value:.4g}"


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

    def start(self, *, experiment: str, start_step: int, num_train_steps: int,
              hparams: Mapping[str, Any]) -> None:
        where = f"resuming from step {start_step}" if start_step > 0 else "starting at step 0"
        self._print(f"{experiment}: {where} of {num_train_steps}")
        if (line := speed_line(hparams)) is not None:
            self._print(line)
        if "placement" in hparams:
            self._print(f"placement: {hparams['placement']}")
        for line in hparams.get("presets", []):
            self._print(f"preset {line}")
        # ``reset`` rather than ``update`` so the steps restored from a checkpoint do not count
        # towards the speed behind the time remaining.
        self._bar.reset(self._task, total=num_train_steps, completed=start_step,
                        description=experiment)
        self._bar.start()

    def progress(self, step: int) -> None:
        self._bar.update(self._task, completed=step)

    def write(self, step: int, kind: str, metrics: Mapping[str, float]) -> None:
        if kind == "train":
            latest = {name: metrics[name] for name in ("loss", "steps_per_sec") if name in metrics}
            self._bar.update(self._task, **latest)
        self._print(format_line(step, kind, metrics))

    def close(self) -> None:
        self._bar.stop()

    def _print(self, line: str) -> None:
        if self._bar.disable:
            print(line, flush=True)
        else:
            # Printed through the bar's console, the line lands above the bar instead of in it.
            self._bar.console.print(line, markup=False)
