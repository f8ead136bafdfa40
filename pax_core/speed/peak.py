"""Peak FLOP/s per device: the denominator of MFU and HFU.

Accelerators use the vendor's dense bfloat16 figure for their device kind, from the hardware
catalogue (``pax_core.speed.hardware``, where each number cites its source). A CPU has no such
figure, so its peak is measured: the best rate of a jitted float32 matrix product, taken once
per machine and cached under the user's cache directory. ``--peak-tflops`` overrides both.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
from typing import Any

import jax
import jax.numpy as jnp

from pax_core.files import cache_dir
from pax_core.speed.hardware import chip_for_device_kind

MATMUL_SIZE = 1024


@dataclasses.dataclass(frozen=True)
class Peak:
    """Peak FLOP/s of one device, and where the number came from (logged with MFU)."""

    flops_per_sec: float
    source: str

    @property
    def tflops(self) -> float:
        return self.flops_per_sec / 1e12


def table_peak(device_kind: str) -> float | None:
    """Dense bf16 TFLOP/s of the catalogue's chip for a device kind, or None for a kind it does
    not know (the catalogue is the one home of these numbers, with their sources)."""
    chip = chip_for_device_kind(device_kind)
    return chip.peak_tflops["bf16"] if chip else None


def matmul_flops_per_sec(dtype: Any = jnp.float32, size: int = MATMUL_SIZE,
                         repeats: int = 10, device: Any = None) -> float:
    """The best FLOP/s of a jitted ``size x size`` matrix product on ``device``."""
    device = device or jax.devices()[0]
    key_a, key_b = jax.random.split(jax.random.key(0))
    a = jax.device_put(jax.random.normal(key_a, (size, size), dtype), device)
    b = jax.device_put(jax.random.normal(key_b, (size, size), dtype), device)
    product = jax.jit(jnp.matmul)
    product(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        product(a, b).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2.0 * size**3 / best


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_path() -> str:
    """``$PAX_CACHE_DIR/cpu_peak.json``, by default in the user's cache directory."""
    return str(cache_dir() / "cpu_peak.json")


def measured_cpu_peak() -> float:
    """The host's float32 matmul FLOP/s, measured on the first call and cached on disk.

    The cache is keyed by processor, core count and jax version, so a different machine or
    compiler measures again. All of the host's fake CPU devices share its cores, so this is
    the whole host's rate.
    """
    key = f"{_cpu_name()} | {os.cpu_count()} cores | jax {jax.__version__}"
    path = cache_path()
    try:
        with open(path, encoding="utf-8") as f:
            cached = json.load(f)
    except (OSError, ValueError):
        cached = {}
    if isinstance(cached.get(key), (int, float)):
        return float(cached[key])
    value = matmul_flops_per_sec(jnp.float32)
    cached = cached if isinstance(cached, dict) else {}
    cached[key] = value
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(cached, f, indent=1)
        os.replace(temporary, path)  # atomic: a concurrent run reads the old or the new file
    except OSError:
        pass  # an unwritable cache costs a measurement per run, nothing else
    return value


def device_peak(devices: list[Any], override_tflops: float | None = None) -> Peak | None:
    """Peak FLOP/s of one of ``devices`` (all of one kind), or None where it is unknown."""
    if override_tflops is not None:
        return Peak(override_tflops * 1e12, "--peak-tflops")
    kind = devices[0].device_kind
    if devices[0].platform == "cpu":
        local = sum(1 for d in devices if d.process_index == devices[0].process_index)
        return Peak(measured_cpu_peak() / local,
                    f"measured float32 matmul, host shared by {local} device(s)")
    tflops = table_peak(kind)
    return Peak(tflops * 1e12, f"{kind}, dense bf16 catalogue") if tflops else None
