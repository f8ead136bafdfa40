"""Training steps in the test's own process, without a job directory: for tests of what an
experiment's configuration does to learning (an optimizer, a schedule, a new layer)."""

from __future__ import annotations

import jax

from pax_core.config.resolve import resolve
from pax_core.plugins.host import PluginHost
from pax_core.run.build import build_run


def first_batch_losses(host: PluginHost, exp: str, plugin: str | None, set_items: list[str],
                       steps: int) -> list[float]:
    """The training loss of ``steps`` steps of ``exp`` (with the ``--set`` items), all on the
    training input's first batch, on every device: a configuration that learns drives it
    down within a few steps, whatever the data."""
    run = build_run(host, resolve(host, exp, plugin, set_items), jax.devices())
    step = run.compile_train_step(donate_state=False)
    batch = run.partitioner.global_batch(run.train_input.get_next())
    state, losses = run.init_state(), []
    for _ in range(steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return losses
