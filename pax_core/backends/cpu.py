"""The built-in backend of the host CPU."""

from __future__ import annotations

from pax_core.backends.base import Backend


class CpuBackend(Backend):
    """The host CPU. Multi-process CPU runs need JAX's gloo collectives, set here explicitly."""

    platform = "cpu"
    # XLA:CPU runs a donated step about 20% slower (a 50M-parameter LM, bench/train_speed.py),
    # and a host has memory to spare.
    donates_train_state = False

    def prepare(self) -> None:
        import jax

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
