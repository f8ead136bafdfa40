"""Putting a run together: runtime, mesh, inputs, model and a train state, fresh or restored.

``pax train`` and ``pax eval`` share this; the loop itself is in ``pax_core.loop``.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import numpy as np

from pax_core.checkpointing import Checkpointer
from pax_core.components import Registered
from pax_core.config import ResolvedRun
from pax_core.errors import RunError, UsageError
from pax_core.inputs.base import Input
from pax_core.partitioning import Partitioner
from pax_core.plugins import PluginHost
from pax_core.state import TrainState, make_init_fn
from pax_core.task import Job


def start_runtime(host: PluginHost, platform: str | None) -> list[jax.Device]:
    """Run the chosen backend's set-up, start JAX, and check the devices it found."""
    name = platform or (os.environ.get("JAX_PLATFORMS") or "").split(",")[0] or None
    backends = host.components("backends")
    if name and not any(e.name == name for e in backends):
        known = ", ".join(sorted({e.name for e in backends}))
        raise UsageError(f"platform '{name}': no installed plugin sets it up (backends: {known}); "
                         f"install the plugin for it or choose another --platform")
    backend = backends.get(name).build() if name else None
    if backend is not None:
        backend.prepare()
    try:
        devices = jax.devices(name) if name else jax.devices()
    except RuntimeError as e:
        raise UsageError(f"platform '{name}' is not available: {e}".splitlines()[0]) from e
    if backend is None:
        detected = devices[0].platform
        if any(e.name == detected for e in backends):
            backend = backends.get(detected).build()
    if backend is not None:
        backend.check(devices)
    return devices


def _component(host: PluginHost, kind: str, name: str, constant: str) -> Registered:
    try:
        return host.components(kind).get(name)
    except UsageError as e:
        raise UsageError(f"{e} (set by the experiment's {constant})") from None


@dataclasses.dataclass
class Run:
    """Everything a loop needs, built from a resolved experiment."""

    resolved: ResolvedRun
    job: Job
    partitioner: Partitioner
    train_input: Input
    eval_inputs: list[Input]
    tx: Any
    state_shardings: Any
    abstract_state: Any
    batch_spec: dict[str, jax.ShapeDtypeStruct]

    @property
    def task(self):
        return self.job.task

    def batch_shardings(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Shardings for a batch of arrays or ``ShapeDtypeStruct``s."""
        return {k: self.partitioner.batch_sharding(len(v.shape)) for k, v in batch.items()}

    def init_state(self) -> TrainState:
        """A fresh state, created directly with its output shardings."""
        init = make_init_fn(self.task.model, self.tx, self.batch_spec)
        seed = np.uint32(self.task.train.random_seed)
        return jax.jit(init, out_shardings=self.state_shardings)(seed)

    def restore_or_init(self, checkpointer: Checkpointer) -> tuple[TrainState, int]:
        """The latest checkpoint onto this run's shardings, or a fresh state at step 0."""
        step = checkpointer.latest_step()
        if step is None:
            return self.init_state(), 0
        try:
            state, input_state = checkpointer.restore(step, self.abstract_state)
        except Exception as e:
            raise RunError(f"cannot restore step {step} from {checkpointer.directory}: "
                           f"{type(e).__name__}: {e}".splitlines()[0]) from e
        if input_state:
            self.train_input.set_state(input_state)
        return state, step


def build_run(host: PluginHost, resolved: ResolvedRun, devices: list[jax.Device]) -> Run:
    """Build the job's objects, the mesh and the shardings; allocate nothing on devices yet."""
    job = resolved.build()
    exp = resolved.experiment
    partitioner = _component(host, "partitioners", exp.PARTITIONER, "PARTITIONER").build()
    partitioner.setup(exp, devices)
    inputs = list(job.datasets)
    for data in inputs:
        partitioner.check_batch_size(data.name, data.batch_size)
        data.shard(jax.process_index(), jax.process_count())
    train_input = next(d for d in inputs if d.is_training)
    eval_inputs = [d for d in inputs if not d.is_training]
    learner = job.task.train.learner
    if learner.num_microbatches > 1:
        per_shard = train_input.batch_size // partitioner.num_batch_shards
        if per_shard % learner.num_microbatches:
            raise UsageError(
                f"num_microbatches {learner.num_microbatches} must divide the per-device batch "
                f"({per_shard}); change task.train.learner.num_microbatches or the batch_size"
            )
    tx = learner.optimizer.build()
    sample = _peek(host, train_input)
    batch_spec = {
        k: jax.ShapeDtypeStruct((train_input.batch_size, *v.shape[1:]), v.dtype)
        for k, v in sample.items()
    }
    init = make_init_fn(job.task.model, tx, batch_spec)
    try:
        abstract = jax.eval_shape(init, np.uint32(0))
    except Exception as e:
        raise host.provider_error("model", job.task.model, e) from e
    shardings = partitioner.state_shardings(abstract)
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )
    return Run(resolved, job, partitioner, train_input, eval_inputs, tx, shardings, abstract,
               batch_spec)


def _peek(host: PluginHost, data: Input) -> dict[str, np.ndarray]:
    try:
        return data.peek()
    except StopIteration:
        raise RunError(f"input '{data.name}' is empty") from None
    except Exception as e:
        raise host.provider_error("input", data, e) from e
