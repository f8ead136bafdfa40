"""Training steps in the test's own process, without a job directory: for tests of what an
experiment's configuration does to learning (an optimizer, a schedule, a new layer)."""

from __future__ import annotations

from typing import Any

import jax

from pax_core.config.resolve import resolve
from pax_core.plugins.host import PluginHost
from pax_core.run.build import build_run


def first_batch_steps(host: PluginHost, exp: str, plugin: str | None, set_items: list[str],
                      steps: int) -> tuple[Any, Any, list[dict[str, float]]]:
    """``steps`` training steps of ``exp`` (with the ``--set`` items), all on the training
    input's first batch, on every device: the fresh state, the state after them (on the host)
    and each step's metrics. What frozen parameters, adapters or an optimizer do to the
    weights shows between the two states."""
    run = build_run(host, resolve(host, exp, plugin, set_items), jax.devices())
    step = run.compile_train_step(donate_state=False)
    batch = run.partitioner.global_batch(run.train_input.get_next())
    start = state = run.init_state()
    metrics = []
    for _ in range(steps):
        state, out = step(state, batch)
        metrics.append({k: float(v) for k, v in out.items()})
    return jax.device_get(start), jax.device_get(state), metrics


def first_batch_losses(host: PluginHost, exp: str, plugin: str | None, set_items: list[str],
                       steps: int) -> list[float]:
    """The training loss of ``steps`` steps of ``exp`` (with the ``--set`` items), all on the
    training input's first batch, on every device: a configuration that learns drives it
    down within a few steps, whatever the data."""
    return [m["loss"] for m in first_batch_steps(host, exp, plugin, set_items, steps)[2]]
