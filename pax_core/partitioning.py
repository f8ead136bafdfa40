"""Where a run's arrays live: the partitioner interface and the data-parallel default.

The training loop talks only to this interface: it asks for the shardings of the train state and
of a batch, and hands over each process's numpy batch to become a global array. A new strategy
(the SPMD partitioner with logical-axis rules, pipelines) is a new ``Partitioner`` registered
through ``pax_register_partitioners``; the loop does not change.
"""

from __future__ import annotations

import abc
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pax_core.errors import UsageError


class Partitioner(abc.ABC):
    """Builds the mesh and says how the state and the batches are sharded over it."""

    mesh: Mesh

    @abc.abstractmethod
    def setup(self, experiment: Any, devices: list[jax.Device]) -> None:
        """Build ``self.mesh`` for ``experiment`` over ``devices``; refuse a mesh that cannot fit
        with a ``UsageError`` naming the experiment constant to change."""

    @abc.abstractmethod
    def state_shardings(self, abstract_state: Any) -> Any:
        """A pytree of shardings matching ``abstract_state`` (``jax.ShapeDtypeStruct`` leaves)."""

    @abc.abstractmethod
    def batch_sharding(self, ndim: int) -> NamedSharding:
        """The sharding of a batch leaf of rank ``ndim`` (leading dimension = examples)."""

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
        size = int(np.prod(list(shape.values())))
        if size != num_devices:
            raise UsageError(
                f"the mesh ICI_MESH_SHAPE {list(ici)} x DCN_MESH_SHAPE {list(dcn)} has {size} "
                f"devices but {num_devices} are available; change ICI_MESH_SHAPE (for example "
                f"--set ICI_MESH_SHAPE=[1,{num_devices},1])"
            )
        return shape

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    @property
    def num_batch_shards(self) -> int:
        """How many ways the batch dimension is split; the global batch must divide by it."""
        return self.mesh.size

    def check_batch_size(self, name: str, batch_size: int) -> None:
        if batch_size % self.num_batch_shards:
            raise UsageError(
                f"dataset '{name}': batch_size {batch_size} does not divide over "
                f"{self.num_batch_shards} devices; set the dataset's batch_size to a multiple of "
                f"{self.num_batch_shards} (--set datasets[i].batch_size=...)"
            )

    def global_batch(self, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Assemble every process's rows into global arrays, without copying through one host."""
        return {
            k: jax.make_array_from_process_local_data(self.batch_sharding(v.ndim), v)
            for k, v in local_batch.items()
        }


class DataParallel(Partitioner):
    """The batch split over every device, parameters and optimizer state replicated.

    The mesh is one axis, ``data``, over all devices. An experiment that declares a mesh may
    only use its batch axes (``replica``, ``data``) here: splitting parameters needs a
    partitioner that shards them.
    """

    BATCH_AXES = ("replica", "data")

    def setup(self, experiment: Any, devices: list[jax.Device]) -> None:
        shape = self.declared_mesh(experiment, len(devices)) or {}
        model_axes = {a: n for a, n in shape.items() if a not in self.BATCH_AXES and n > 1}
        if model_axes:
            raise UsageError(
                f"PARTITIONER 'data_parallel' replicates parameters and cannot split mesh axes "
                f"{model_axes}; set those axes to 1 in ICI_MESH_SHAPE or choose a partitioner "
                f"that shards parameters"
            )
        self.mesh = Mesh(np.asarray(devices).reshape(-1), ("data",))

    def state_shardings(self, abstract_state: Any) -> Any:
        return jax.tree.map(lambda _: self.replicated, abstract_state)

    def batch_sharding(self, ndim: int) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec("data", *([None] * (ndim - 1))))
