"""The device memory figure of a train summary: the step's true peak, not what is in use
between steps."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from pax_core.run.memory_use import (
    GIB,
    device_peak_gib,
    planned_peak_bytes,
    step_working_bytes,
)


class Device:
    """A device as a TPU runtime reports it: what is in use, and a peak only if given."""

    def __init__(self, **stats: int):
        self.stats = stats

    def memory_stats(self) -> dict[str, int]:
        return self.stats


def _step(donate: bool):
    def step(state, batch):
        hidden = jnp.tanh(batch @ state)  # a [1024, 1024] float32 temporary
        return state - 1e-3 * (hidden.T @ batch) / 1024

    state, batch = jnp.ones((1024, 1024)), jnp.ones((1024, 1024))
    jitted = jax.jit(step, donate_argnums=(0,) if donate else ())
    return jitted.lower(state, batch).compile()


def test_the_step_s_working_memory_is_its_temporaries_and_fresh_outputs():
    """On the CPU: its arguments, every temporary and the outputs that reuse no donated
    argument's buffer (the CPU compiler's own peak leaves the temporaries out)."""
    donated, kept = _step(True), _step(False)
    analysis = donated.memory_analysis()
    assert analysis.alias_size_in_bytes == 4 * 2**20  # the new state reuses the old one's
    assert step_working_bytes(donated, "cpu") == analysis.temp_size_in_bytes
    assert planned_peak_bytes(donated, "cpu") == (analysis.argument_size_in_bytes
                                                  + analysis.temp_size_in_bytes)
    assert step_working_bytes(kept, "cpu") == (kept.memory_analysis().temp_size_in_bytes
                                               + 4 * 2**20)
    assert step_working_bytes(object(), "cpu") == 0  # a backend without the analysis


def test_a_tpu_step_s_peak_is_its_compiler_s_own():
    """The TPU compiler's peak counts what is live at once (bench/tpu_train.py: a step it puts
    at 15.0 GiB ran on a 15.75 GiB chip; its arguments and temporaries add up to 18.1)."""
    step = _step(True)
    analysis = step.memory_analysis()
    assert planned_peak_bytes(step, "tpu") == analysis.peak_memory_in_bytes
    assert step_working_bytes(step, "tpu") == (analysis.peak_memory_in_bytes
                                               - analysis.argument_size_in_bytes)


def test_the_peak_adds_the_step_s_working_memory_to_what_is_in_use():
    in_use = 5 * GIB
    step = step_working_bytes(_step(True), "cpu")
    assert step > 4 * 2**20
    peak = device_peak_gib([Device(bytes_in_use=in_use)], step)
    assert peak == pytest.approx((in_use + step) / GIB)
    # A runtime that reports a larger peak of its own is believed.
    assert device_peak_gib([Device(bytes_in_use=in_use, peak_bytes_in_use=9 * GIB)], step) == 9
    assert device_peak_gib([Device(bytes_in_use=in_use), Device(bytes_in_use=in_use // 2)],
                           step) == peak
    assert device_peak_gib([], step) is None


def test_the_memory_limit_is_the_smallest_device_s_and_none_on_the_cpu():
    from pax_core.run.memory_use import device_memory_limit

    assert device_memory_limit([Device(bytes_limit=16 * GIB), Device(bytes_limit=15 * GIB)]) \
        == 15 * GIB
    assert device_memory_limit(jax.devices()) is None  # the host CPU reports none
