"""Where a run's arrays live: the partitioner interface.

The training loop talks only to this interface: the partitioner builds the mesh, gives the
shardings of the train state (from each leaf's logical axis names) and of a batch, turns each
process's numpy batch into global arrays, and compiles the init, train and eval computations.
A new strategy is a new ``Partitioner`` registered through ``pax_register_partitioners``; the
loop does not change. The built-in strategies are ``pax_core.parallel.data_parallel`` and
``pax_core.parallel.spmd``.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pax_core.errors import UsageError
from pax_core.parallel.layouts import MeshLayout


class Reduction:
    """How a step combines values across the shards it sees.

    Under ``jax.jit`` over global arrays (SPMD) a step already sees the whole batch, so nothing
    is left to combine; under ``shard_map`` each device sees its rows and must average gradients
    and add up metric sums explicitly.
    """

    def mean(self, tree: Any) -> Any:
        return tree

    def sum(self, tree: Any) -> Any:
        return tree

    def max(self, tree: Any) -> Any:
        return tree

    def gradients(self, tree: Any) -> Any:
        """The mean over shards of each shard's gradient of its own loss."""
        return tree


class AxisReduction(Reduction):
    """Collectives over one mesh axis, for steps written per shard."""

    def __init__(self, axis: str):
        self.axis = axis

    def mean(self, tree: Any) -> Any:
        return jax.lax.pmean(tree, self.axis)

    def sum(self, tree: Any) -> Any:
        return jax.lax.psum(tree, self.axis)

    def max(self, tree: Any) -> Any:
        return jax.lax.pmax(tree, self.axis)

    def gradients(self, tree: Any) -> Any:
        return jax.lax.pmean(tree, self.axis)


_ACTIVE_REDUCTION: contextvars.ContextVar[Reduction | None] = contextvars.ContextVar(
    "pax_active_reduction", default=None)


def mean_across_shards(tree: Any) -> Any:
    """The mean of ``tree`` over the shards of the batch that the running step sees.

    A model calls it on per-example statistics it has already averaged over its own rows
    (synchronised batch norm's mean and mean square): under the SPMD partitioner the step sees
    the global batch, so the values are returned as they are; under the data-parallel one each
    device sees its rows, and the values are averaged across devices. Outside a train or eval
    step it is the identity.
    """
    reduction = _ACTIVE_REDUCTION.get()
    return tree if reduction is None else reduction.mean(tree)


@contextlib.contextmanager
def reducing_with(reduction: Reduction):
    """Make ``reduction`` the one ``mean_across_shards`` uses while a step is traced."""
    token = _ACTIVE_REDUCTION.set(reduction)
    try:
        yield
    finally:
        _ACTIVE_REDUCTION.reset(token)


class Partitioner(abc.ABC):
    """Builds the mesh, says how state and batches are sharded, and compiles the steps."""

    mesh: Mesh
    reduction: Reduction = Reduction()
    # Places the devices in a declared mesh; the run sets the experiment's (MESH_LAYOUT) before
    # ``setup``.
    layout: MeshLayout = MeshLayout()

    @abc.abstractmethod
    def setup(self, experiment: Any, devices: list[jax.Device]) -> None:
        """Build ``self.mesh`` for ``experiment`` over ``devices``; refuse a mesh that cannot fit
        with a ``UsageError`` naming the experiment constant to change."""

    @abc.abstractmethod
    def state_shardings(self, abstract_state: Any, logical_axes: Any) -> Any:
        """Shardings matching ``abstract_state`` (``ShapeDtypeStruct`` leaves), given each leaf's
        logical axis names (a ``PartitionSpec`` of names, empty when the model named none)."""

    @abc.abstractmethod
    def batch_sharding(self, ndim: int) -> NamedSharding:
        """The sharding of a batch leaf of rank ``ndim`` (leading dimension = examples)."""

    @property
    def num_batch_shards(self) -> int:
        """How many ways the batch dimension is split; the global batch must divide by it."""
        spec = self.batch_sharding(1).spec[0]
        axes = spec if isinstance(spec, tuple) else (spec,) if spec else ()
        return math.prod(self.mesh.shape[a] for a in axes)

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def describe(self, batch_size: int) -> dict[str, Any]:
        """Facts about how a training batch of ``batch_size`` runs on this placement, worth a
        user's attention (a pipeline's stages, microbatches and bubble): shown by ``pax plan``,
        written in the run's start record and printed when it starts. Flat names, JSON values;
        the built-in partitioners have nothing to add."""
        return {}

    def context(self) -> contextlib.AbstractContextManager:
        """Entered around every compiled call (tracing happens inside it)."""
        return contextlib.nullcontext()

    def compile_init(self, fn: Callable, out_shardings: Any) -> Callable:
        """``fn(seed) -> state``, creating every shard where it lives."""
        return self._in_context(jax.jit(fn, out_shardings=out_shardings))

    def compile_step(self, fn: Callable, state_shardings: Any, batch_shardings: Any,
                     out_shardings: Any, donate_state: bool = False) -> Callable:
        """``fn(state, batch) -> outputs`` over global arrays."""
        jitted = jax.jit(fn, in_shardings=(state_shardings, batch_shardings),
                         out_shardings=out_shardings,
                         donate_argnums=(0,) if donate_state else ())
        return self._in_context(jitted)

    def _in_context(self, fn: Callable) -> Callable:
        def call(*args):
            with self.context():
                return fn(*args)

        call.lower = lambda *args: self._lower(fn, *args)
        return call

    def _lower(self, fn: Callable, *args: Any):
        with self.context():
            return fn.lower(*args)

    def check_batch_size(self, name: str, batch_size: int) -> None:
        if batch_size % self.num_batch_shards:
            raise UsageError(
                f"dataset '{name}': batch_size {batch_size} does not divide over the "
                f"{self.num_batch_shards} batch shards of the mesh; use a multiple of "
                f"{self.num_batch_shards} (PERCORE_BATCH_SIZE, or --set datasets[i].batch_size)"
            )

    def global_batch(self, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Assemble every process's rows into global arrays, without copying through one host."""
        return {
            k: jax.make_array_from_process_local_data(self.batch_sharding(v.ndim), v)
            for k, v in local_batch.items()
        }

    @staticmethod
    def declared_mesh(experiment: Any, num_devices: int) -> dict[str, int] | None:
        """The experiment's ICI x DCN mesh as ``{axis: size}``, checked against the devices;
        None when the experiment declares none (Pax's data-parallel path)."""
        ici, dcn = experiment.ICI_MESH_SHAPE, experiment.DCN_MESH_SHAPE
        names = tuple(experiment.MESH_AXIS_NAMES)
        if ici is None:
            return None
        dcn = dcn if dcn is not None else [1] * len(ici)
        if not len(ici) == len(dcn) == len(names):
            raise UsageError(f"ICI_MESH_SHAPE {list(ici)}, DCN_MESH_SHAPE {list(dcn)} and "
                             f"MESH_AXIS_NAMES {list(names)} must have the same length")
        shape = {name: i * d for name, i, d in zip(names, ici, dcn, strict=True)}
        size = math.prod(shape.values())
        if size != num_devices:
            raise UsageError(
                f"the mesh ICI_MESH_SHAPE {list(ici)} x DCN_MESH_SHAPE {list(dcn)} has {size} "
                f"devices but {num_devices} are available; change ICI_MESH_SHAPE (for example "
                f"--set ICI_MESH_SHAPE=[1,{num_devices},1])"
            )
        return shape
