"""How much memory a run holds, logged with every train summary: the process's resident set on
the host, and the device memory in use at the peak so far (the largest over this process's
devices; only where the runtime reports it: GPUs and TPUs, not the CPU)."""

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


def device_peak_gib(devices: Sequence[Any]) -> float | None:
    """The largest peak of device memory in use over ``devices``; None where none reports
    its memory."""
    peaks = [stats.get("peak_bytes_in_use", stats.get("bytes_in_use", 0))
             for stats in (_stats(d) for d in devices) if stats]
    return max(peaks) / GIB if peaks else None


def memory_metrics(devices: Sequence[Any]) -> dict[str, float]:
    """``host_memory_gib`` and, where the devices report it, ``device_memory_peak_gib``."""
    found = {"host_memory_gib": host_resident_gib()}
    if (device := device_peak_gib(devices)) is not None:
        found["device_memory_peak_gib"] = device
    return found


def _stats(device: Any) -> dict[str, int] | None:
    try:
        return device.memory_stats()
    except Exception:  # a runtime without the call
        return None
