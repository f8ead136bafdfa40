"""How fast a run goes: where its wall-clock time went, and how much of the chips it used.

``StepClock`` charges every moment of the loop to the phase that just ended (waiting for input,
in the step, writing a checkpoint, evaluating), so the phases add up to the wall-clock time and
nothing is measured twice. "In the step" is host time spent dispatching steps and waiting for
the device: with asynchronous dispatch the device computes while the host waits for input, so a
large input share means the device was starved only when the step share is small.

``Utilisation`` turns steps/s into MFU (model FLOPs over peak) and HFU (hardware FLOPs over
peak), see ``pax_core.speed.flops`` and ``pax_core.speed.peak``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from pax_core.speed.flops import StepFlops
from pax_core.speed.peak import Peak

PHASES = ("input", "step", "checkpoint", "eval")


def process_age() -> float | None:
    """Seconds since this process started, from the kernel's records (None where there is no
    ``/proc``): launch to now, the interpreter's start and every import included."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return uptime - ticks / os.sysconf("SC_CLK_TCK")


class StepClock:
    """Seconds per phase since the last summary."""

    def __init__(self) -> None:
        self._spent = dict.fromkeys(PHASES, 0.0)
        self._mark = time.perf_counter()

    def restart(self) -> None:
        """Forget what was charged; the next charge counts from now."""
        self._spent = dict.fromkeys(PHASES, 0.0)
        self._mark = time.perf_counter()

    def charge(self, phase: str) -> None:
        """Charge the time since the previous charge to ``phase``."""
        now = time.perf_counter()
        self._spent[phase] += now - self._mark
        self._mark = now

    def spent(self, phase: str) -> float:
        """Seconds charged to ``phase`` since the last restart."""
        return self._spent[phase]

    def lap(self, steps: int) -> tuple[float, dict[str, float]]:
        """(steps/s over training time, milliseconds per step in each phase); then restart.

        Called in the step phase, which is charged first. Steps/s leaves eval time out, so
        that evaluating more often does not look like slower training; the breakdown shows it.
        """
        self.charge("step")
        spent, steps = self._spent, max(steps, 1)
        training = sum(spent.values()) - spent["eval"]
        breakdown = {f"time_{p}_ms": 1e3 * spent[p] / steps for p in PHASES}
        self.restart()
        return steps / max(training, 1e-9), breakdown


@dataclasses.dataclass(frozen=True)
class Utilisation:
    """MFU and HFU of a run from its steps/s."""

    flops: StepFlops
    peak: Peak | None
    num_devices: int

    def metrics(self, steps_per_sec: float, flops: StepFlops | None = None) -> dict[str, float]:
        """MFU and HFU at ``steps_per_sec`` steps of ``flops`` each (default: ``self.flops``;
        an input of several batch shapes passes the average of the steps measured)."""
        flops = flops or self.flops
        values: dict[str, float] = {}
        if flops.model:
            per_device = flops.model * steps_per_sec / self.num_devices
            values["model_tflops_per_device"] = per_device / 1e12
            if self.peak:
                values["mfu"] = per_device / self.peak.flops_per_sec
        if flops.hardware and self.peak:
            per_device = flops.hardware * steps_per_sec / self.num_devices
            values["hfu"] = per_device / self.peak.flops_per_sec
        return values

    def settings(self) -> dict[str, Any]:
        """What the numbers were computed with, recorded once at the start of a run; None
        where a count or the peak is unknown."""
        return {
            "flops_formula": self.flops.formula,
            "model_flops_per_step": self.flops.model,
            "hardware_flops_per_step": self.flops.hardware,
            "peak_tflops_per_device": self.peak.tflops if self.peak else None,
            "peak_source": self.peak.source if self.peak else "unknown device kind",
        }
