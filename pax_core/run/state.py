"""The one structure a run carries between steps, and how it is created already sharded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct


@struct.dataclass
class TrainState:
    """Parameters, optimizer state, the step counter and the RNG key: all a checkpoint holds."""

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array


def make_init_fn(model: nn.Module, tx: optax.GradientTransformation,
                 batch_spec: dict[str, jax.ShapeDtypeStruct], *, boxed: bool = False
                 ) -> Callable[[Any], TrainState]:
    """A function of a seed that builds a fresh ``TrainState``.

    It takes only a seed (the batch is zeros made inside) so that it can run under ``jax.jit``
    with output shardings: every device creates just its own shard of the parameters, and the
    model is never materialised whole on one device. With ``boxed`` the parameters (and the
    optimizer state that mirrors them) keep Flax's logical-axis boxes, which is how a
    partitioner learns each weight's logical axis names (``jax.eval_shape`` of it, never run).
    """

    def init(seed: jax.Array) -> TrainState:
        rng = jax.random.PRNGKey(seed)
        params_rng, dropout_rng, state_rng = jax.random.split(rng, 3)
        batch = {k: jnp.zeros(s.shape, s.dtype) for k, s in batch_spec.items()}
        variables = model.init({"params": params_rng, "dropout": dropout_rng}, batch, train=False)
        params = variables["params"] if boxed else nn.meta.unbox(variables["params"])
        return TrainState(params, tx.init(params), jnp.zeros((), jnp.int32), state_rng)

    return init


def logical_axes(abstract_boxed_state: TrainState) -> Any:
    """Per leaf of the state, a ``PartitionSpec`` of logical axis names (empty for leaves the
    model did not name, such as the step counter)."""
    return nn.get_partition_spec(abstract_boxed_state)


def count_params(params: Any) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))
