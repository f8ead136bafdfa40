"""How much memory a run holds, logged with every train summary: the process's resident set on
the host, and the device memory in use at the peak so far (the largest over this process's
devices; only where the runtime reports its memory: GPUs and TPUs, not the CPU).

The device peak is the larger of the runtime's own peak and what is in use between steps plus
what the compiled step holds beyond its arguments at its peak (``step_working_bytes``): a TPU
runtime's peak leaves out the programs' temporaries (it read the same 5.3 GiB, the weights and
Adam's state, whatever the batch or the rematerialisation), which are what a step's peak
depends on; the TPU compiler's memory analysis gives the step's own peak.
"""

from __future__ import annotations

import os
import resource
from collections.abc import Sequence
from typing import Any

GIB = 2**30


def host_resident_gib() -> float:
    """The process's resident set now (Linux's ``/proc/self/statm``), or its peak where there
    is no ``/proc`` (``getrusage``: KiB on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/statm") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / GIB
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (GIB if os.uname().sysname == "Darwin" else 2**20)


# Platforms whose compiler's memory analysis gives a step's true peak (``peak_memory_in_bytes``:
# what is live at once). The TPU's does (a step it puts at 15.0 GiB ran on a 15.75 GiB chip
# while its arguments and temporaries add up to 18.1); the CPU's leaves the temporaries out.
PEAK_ANALYSED = frozenset({"tpu"})


def planned_peak_bytes(compiled: Any, platform: str) -> int:
    """A device's memory at a compiled step's peak, by the compiler's analysis: its own peak
    where ``platform``'s compiler gives a true one, else the arguments, every temporary and
    the outputs that do not reuse a donated argument's buffer; 0 without an analysis."""
    try:
        analysis = compiled.memory_analysis()
    except Exception:  # a backend without the analysis: no figure, not a failure
        return 0
    if analysis is None:
        return 0
    if platform in PEAK_ANALYSED and getattr(analysis, "peak_memory_in_bytes", 0):
        return int(analysis.peak_memory_in_bytes)
    fresh = analysis.output_size_in_bytes - analysis.alias_size_in_bytes
    return int(analysis.argument_size_in_bytes + analysis.temp_size_in_bytes + max(0, fresh))


def step_working_bytes(compiled: Any, platform: str) -> int:
    """What a compiled step holds on a device at its peak beyond its arguments."""
    peak = planned_peak_bytes(compiled, platform)
    return max(0, peak - compiled.memory_analysis().argument_size_in_bytes) if peak else 0


def device_peak_gib(devices: Sequence[Any], step_bytes: int = 0) -> float | None:
    """The largest peak of device memory over ``devices``: the runtime's, or what is in use
    now plus ``step_bytes`` (a step's working memory), whichever is larger; None where no
    device reports its memory."""
    peaks = [max(stats.get("peak_bytes_in_use", 0), stats.get("bytes_in_use", 0) + step_bytes)
             for stats in (_stats(d) for d in devices) if stats]
    return max(peaks) / GIB if peaks else None


def device_memory_limit(devices: Sequence[Any]) -> int | None:
    """The smallest memory limit of ``devices``; None where none reports one (the CPU)."""
    limits = [int(stats["bytes_limit"]) for stats in (_stats(d) for d in devices)
              if stats and stats.get("bytes_limit")]
    return min(limits) if limits else None


def memory_metrics(devices: Sequence[Any], step_bytes: int = 0) -> dict[str, float]:
    """``host_memory_gib`` and, where the devices report it, ``device_memory_peak_gib``."""
    found = {"host_memory_gib": host_resident_gib()}
    if (device := device_peak_gib(devices, step_bytes)) is not None:
        found["device_memory_peak_gib"] = device
    return found


def _stats(device: Any) -> dict[str, int] | None:
    try:
        return device.memory_stats()
    except Exception:  # a runtime without the call
        return None
