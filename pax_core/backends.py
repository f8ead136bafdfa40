"""Per-platform runtime set-up: what must happen before JAX starts, and checks after."""

from __future__ import annotations

from typing import Any


class Backend:
    """Base of a platform's set-up; both steps do nothing unless a platform needs them."""

    platform = ""
    # Whether the train step reuses the old state's buffers for the new one. Accelerators need
    # it: their memory is what limits a model.
    donates_train_state = True

    def prepare(self) -> None:
        """Runs before JAX initialises its runtime: environment variables, XLA flags."""

    def check(self, devices: list[Any]) -> None:
        """Runs once the devices are known; raise ``UsageError`` for unusable ones."""


class CpuBackend(Backend):
    """The host CPU. Multi-process CPU runs need JAX's gloo collectives, set here explicitly."""

    platform = "cpu"
    # XLA:CPU runs a donated step about 20% slower (a 50M-parameter LM, bench/train_speed.py),
    # and a host has memory to spare.
    donates_train_state = False

    def prepare(self) -> None:
        import jax

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
