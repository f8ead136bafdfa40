"""The fake CPU devices tests run on, and how they compile."""

from __future__ import annotations

import os

from pax_core.backends.cpu import with_device_count

# A test compiles far more than it runs, and LLVM's optimisations are nearly half of a CPU
# compile. Without them XLA runs the same HLO, fusions and buffers; only the machine code
# differs, and with it the last bits of some results (how multiply-adds are contracted), as
# between any two builds. Every comparison a test makes is between programs compiled alike or
# within a float tolerance, so tests compile without them (`pax plan`, which never runs what it
# compiles, does the same: ``ANALYSIS_ONLY``).
FAST_COMPILE = "--xla_backend_optimization_level=0"


def cpu_xla_flags(count: int, flags: str = "") -> str:
    """``XLA_FLAGS`` for ``count`` fake CPU devices compiling as tests do (``FAST_COMPILE``),
    keeping the other flags of ``flags``: what a test hands the processes it starts."""
    kept = [f for f in flags.split() if not f.startswith("--xla_backend_optimization_level=")]
    return with_device_count(" ".join([*kept, FAST_COMPILE]), count)


def use_cpu_devices(count: int = 8) -> None:
    """Make JAX's CPU platform show ``count`` devices, compiling as tests do
    (``cpu_xla_flags``); must run before JAX starts."""
    os.environ["XLA_FLAGS"] = cpu_xla_flags(count, os.environ.get("XLA_FLAGS", ""))
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
