"""What the engine and beam search both need of a decoder's KV cache: its shapes for a number
of rows, the axis its rows lie on, and where on the devices a decoding state belongs."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding


def cache_shapes(decoder: Any, batch: int) -> Any:
    """The decoder's cache for ``batch`` rows, as shapes (nothing initialised)."""
    shapes = jax.eval_shape(lambda: decoder.init(
        jax.random.PRNGKey(0), jnp.zeros((batch, 1), jnp.int32), decode=True))
    return shapes["cache"]


def row_axes(decoder: Any) -> Any:
    """The axis of every cache entry its rows lie on (0, or 1 under a scanned stack's layers
    axis): where the shapes of two row counts differ."""

    def axis(two: jax.ShapeDtypeStruct, three: jax.ShapeDtypeStruct) -> int:
        [found] = [i for i, (a, b) in enumerate(zip(two.shape, three.shape, strict=True))
                   if a != b]
        return found

    return jax.tree.map(axis, cache_shapes(decoder, 2), cache_shapes(decoder, 3))


def state_placement(variables: Any) -> jax.sharding.Sharding:
    """Where a decoding state lives: whole on every device the weights are on (replicated
    over their mesh), or on the default device for weights not yet on one."""
    for leaf in jax.tree.leaves(variables):
        if isinstance(leaf, jax.Array):
            sharding = leaf.sharding
            if isinstance(sharding, NamedSharding):
                return NamedSharding(sharding.mesh, PartitionSpec())
            devices = sorted(sharding.device_set, key=lambda d: d.id)
            if len(devices) == 1:
                return SingleDeviceSharding(devices[0])
            return NamedSharding(Mesh(np.asarray(devices), ("devices",)), PartitionSpec())
    return SingleDeviceSharding(jax.devices()[0])
