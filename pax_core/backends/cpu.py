"""The built-in backend of the host CPU."""

from __future__ import annotations

import os
import re

from pax_core.backends.base import Backend

_DEVICE_COUNT = re.compile(r"--xla_force_host_platform_device_count=(\d+)")


def with_device_count(flags: str, count: int) -> str:
    """``XLA_FLAGS`` value ``flags`` with the host's fake device count set to ``count``, every
    other flag kept."""
    kept = _DEVICE_COUNT.sub("", flags).split()
    return " ".join([*kept, f"--xla_force_host_platform_device_count={count}"])


class CpuBackend(Backend):
    """The host CPU. Multi-process CPU runs need JAX's gloo collectives, set here explicitly."""

    platform = "cpu"
    # XLA:CPU runs a donated step about 20% slower (a 50M-parameter LM, bench/train_speed.py),
    # and a host has memory to spare.
    donates_train_state = False

    def share(self, index: int, count: int) -> dict[str, str]:
        """The host's fake devices (XLA's host device count, 1 when unset) split evenly, at
        least one each; the other XLA flags are kept."""
        del index
        flags = os.environ.get("XLA_FLAGS", "")
        found = _DEVICE_COUNT.search(flags)
        each = max(1, (int(found.group(1)) if found else 1) // count)
        return {"XLA_FLAGS": with_device_count(flags, each)}

    def prepare(self) -> None:
        import jax

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
