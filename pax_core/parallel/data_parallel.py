"""Pax's data-parallel path (its pmap path), written with ``shard_map``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pax_core.axes import DATA, REPLICA
from pax_core.errors import UsageError
from pax_core.parallel.partitioner import AxisReduction, Partitioner, Reduction


class DataParallel(Partitioner):
    """Pax's data-parallel path: parameters and optimizer state replicated on every device,
    each device a slice of the batch, gradients averaged across devices.

    Steps are written per shard with ``shard_map`` and explicit collectives over the one mesh
    axis, ``data``, as Pax's pmap path is; on one device they are compiled as they are, with no
    collectives (the per-shard wrapper costs compile time and nothing else there). An
    experiment that declares a mesh may only use its batch axes (``replica``, ``data``) here:
    splitting parameters needs the SPMD partitioner.
    """

    BATCH_AXES = (REPLICA, DATA)

    @property
    def reduction(self) -> Reduction:
        return AxisReduction(DATA) if self.mesh.size > 1 else Reduction()

    def setup(self, experiment: Any, devices: list[jax.Device]) -> None:
        shape = self.declared_mesh(experiment, len(devices)) or {}
        model_axes = {a: n for a, n in shape.items() if a not in self.BATCH_AXES and n > 1}
        if model_axes:
            raise UsageError(
                f"PARTITIONER 'data_parallel' replicates parameters and cannot split mesh axes "
                f"{model_axes}; set those axes to 1 in ICI_MESH_SHAPE or use PARTITIONER 'spmd'"
            )
        self.mesh = Mesh(np.asarray(devices).reshape(-1), (DATA,))

    def state_shardings(self, abstract_state: Any, logical_axes: Any) -> Any:
        return jax.tree.map(lambda _: self.replicated, abstract_state)

    def batch_sharding(self, ndim: int) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec(DATA, *([None] * (ndim - 1))))

    def compile_step(self, fn: Callable, state_shardings: Any, batch_shardings: Any,
                     out_shardings: Any, donate_state: bool = False) -> Callable:
        if self.mesh.size == 1:
            return super().compile_step(fn, state_shardings, batch_shardings, out_shardings,
                                        donate_state)
        # Without JAX's varying-axes tracking, gradients stay per shard (as under pmap) and the
        # step averages them itself; the tracking also rejects some of jax 0.12's primitives.
        per_shard = jax.shard_map(fn, mesh=self.mesh,
                                  in_specs=(PartitionSpec(), PartitionSpec(DATA)),
                                  out_specs=PartitionSpec(), check_vma=False)
        return super().compile_step(per_shard, state_shardings, batch_shardings, out_shardings,
                                    donate_state)
