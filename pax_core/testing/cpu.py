"""The fake CPU devices tests run on, and how they compile."""

from __future__ import annotations

import os

from pax_core.backends.cpu import with_device_count

# A test compiles far more than it runs. LLVM's optimisations are nearly half of a CPU compile,
# and XLA's MLIR fusion emitters a quarter of what is left (their generated code is faster to
# run, which a test's few steps of tiny models never repay). Without either XLA runs the same
# HLO, fusions and buffers through its legacy emitters; only the machine code differs, and with
# it the last bits of some results (how multiply-adds are contracted), as between any two
# builds. Every comparison a test makes is between programs compiled alike or within a float
# tolerance, so tests compile without them (`pax plan`, which never runs what it compiles,
# skips the first too: ``ANALYSIS_ONLY``).
FAST_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def cpu_xla_flags(count: int, flags: str = "") -> str:
    """``XLA_FLAGS`` for ``count`` fake CPU devices compiling as tests do (``FAST_COMPILE``),
    keeping the other flags of ``flags``: what a test hands the processes it starts."""
    names = tuple(flag.partition("=")[0] + "=" for flag in FAST_COMPILE)
    kept = [f for f in flags.split() if not f.startswith(names)]
    return with_device_count(" ".join([*kept, *FAST_COMPILE]), count)


def use_cpu_devices(count: int = 8) -> None:
    """Make JAX's CPU platform show ``count`` devices, compiling as tests do
    (``cpu_xla_flags``); must run before JAX starts."""
    os.environ["XLA_FLAGS"] = cpu_xla_flags(count, os.environ.get("XLA_FLAGS", ""))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
