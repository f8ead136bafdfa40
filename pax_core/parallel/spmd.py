"""The SPMD partitioner: sharding declared as a mapping from logical axis names to mesh axes.

Layers name the axes of every weight and key activation with the logical names of
``pax_core.axes``; an experiment's ``LOGICAL_AXIS_RULES`` map them onto the mesh axes of
``MESH_AXIS_NAMES``, and XLA's SPMD partitioner does the rest. Without rules it uses
``pax_core.axes.DEFAULT_RULES``, Pax's canonical LM sharding.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pax_core.axes import BATCH, DEFAULT_RULES, LENGTH, Rules
from pax_core.errors import UsageError
from pax_core.parallel.partitioner import Partitioner


class Spmd(Partitioner):
    """Shards parameters, optimizer state and activations by logical axis rules: the
    experiment's ``LOGICAL_AXIS_RULES``, else ``default_rules``."""

    default_rules: Rules = DEFAULT_RULES

    def setup(self, experiment: Any, devices: list[jax.Device]) -> None:
        shape = self.declared_mesh(experiment, len(devices))
        if shape is None:
            raise UsageError("PARTITIONER 'spmd' needs a declared mesh: set ICI_MESH_SHAPE (for "
                             f"example --set ICI_MESH_SHAPE=[1,{len(devices)},1])")
        ici = list(experiment.ICI_MESH_SHAPE)
        dcn = list(experiment.DCN_MESH_SHAPE or [1] * len(ici))
        self.mesh = Mesh(self.layout.device_grid(devices, ici, dcn), tuple(shape))
        rules = getattr(experiment, "LOGICAL_AXIS_RULES", None) or self.default_rules
        self.rules = tuple((name, tuple(axes) if isinstance(axes, list) else axes)
                           for name, axes in rules)
        self._check_rules()

    def _check_rules(self) -> None:
        for name, axes in self.rules:
            named = axes if isinstance(axes, tuple) else (axes,) if axes else ()
            unknown = [a for a in named if a not in self.mesh.shape]
            if unknown:
                raise UsageError(
                    f"LOGICAL_AXIS_RULES maps '{name}' to mesh axis {unknown[0]!r}, which is not "
                    f"in MESH_AXIS_NAMES {list(self.mesh.axis_names)}"
                )

    def context(self) -> contextlib.AbstractContextManager:
        stack = contextlib.ExitStack()
        stack.enter_context(jax.set_mesh(self.mesh))
        stack.enter_context(nn.logical_axis_rules(self.rules))
        return stack

    def mesh_spec(self, logical: PartitionSpec) -> PartitionSpec:
        """The mesh axes of a tensor whose axes have the logical names ``logical``."""
        known = {name for name, _ in self.rules}
        for name in logical:
            for part in name if isinstance(name, tuple) else (name,):
                if part is not None and part not in known:
                    raise UsageError(
                        f"the model uses the logical axis '{part}', which LOGICAL_AXIS_RULES "
                        f"does not map; add ('{part}', None) or a mesh axis to the rules"
                    )
        return nn.logical_to_mesh_axes(logical, self.rules)

    def state_shardings(self, abstract_state: Any, logical_axes: Any) -> Any:
        def sharding(path, leaf, logical):
            spec = self.mesh_spec(logical)
            self._check_divisible(jax.tree_util.keystr(path), leaf.shape, spec)
            return NamedSharding(self.mesh, spec)

        specs = jax.tree.leaves(logical_axes, is_leaf=lambda x: isinstance(x, PartitionSpec))
        leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract_state)
        return treedef.unflatten(
            [sharding(path, leaf, spec) for (path, leaf), spec in zip(leaves, specs, strict=True)]
        )

    def _check_divisible(self, where: str, shape: tuple[int, ...], spec: PartitionSpec) -> None:
        for dim, axes in zip(shape, spec, strict=False):
            named = axes if isinstance(axes, tuple) else (axes,) if axes else ()
            ways = math.prod(self.mesh.shape[a] for a in named)
            if dim % ways:
                raise UsageError(
                    f"state{where}: a dimension of {dim} does not divide over mesh axes "
                    f"{list(named)} ({ways} devices); change ICI_MESH_SHAPE or the model size"
                )

    def batch_sharding(self, ndim: int) -> NamedSharding:
        spec = self.mesh_spec(PartitionSpec(BATCH, *([LENGTH] if ndim > 1 else []),
                                             *([None] * max(ndim - 2, 0))))
        return NamedSharding(self.mesh, spec)
