"""The one structure a run carries between steps, and how it is created already sharded."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct
from jax.sharding import PartitionSpec

from pax_core.config.transforms import EmaState


@struct.dataclass
class TrainState:
    """Parameters, optimizer state, the step counter, the RNG key and the model's own state:
    all a checkpoint holds.

    ``model_state`` holds the model's Flax variable collections other than ``params`` (batch
    norm's moving statistics in ``batch_stats``, say): values a train step updates by running
    the model rather than by the optimizer. It is empty for a model without any. One
    collection is updated differently: ``_overwrite_with_gradient`` (Flax's, holding FP8
    matmuls' scales and amax histories) takes its gradient as its next value, the convention
    of Flax's FP8 operations, whose backward pass returns the updated values as gradients.
    """

    params: Any
    opt_state: Any
    step: jax.Array
    rng: jax.Array
    model_state: Any = struct.field(default_factory=dict)

    def variables(self, params: Any = None) -> dict[str, Any]:
        """The model's variables for ``model.apply``: ``params`` (these, or the state's own)
        beside the collections of ``model_state``."""
        return {"params": self.params if params is None else params, **self.model_state}


def make_init_fn(model: nn.Module, tx: optax.GradientTransformation,
                 batch_spec: dict[str, jax.ShapeDtypeStruct]) -> Callable[[Any], TrainState]:
    """A function of a seed that builds a fresh ``TrainState``, its parameters and model
    state in Flax's logical-axis boxes (``nn.meta.unbox`` takes them off).

    It takes only a seed (the batch is zeros made inside) so that it can run under ``jax.jit``
    with output shardings: every device creates just its own shard of the parameters, and the
    model is never materialised whole on one device. The boxes are how a partitioner learns
    each weight's logical axis names (``build_run`` traces this once, and ``Run.init_state``
    replays that trace); the optimizer always sees plain arrays, since its state need not have
    the parameters' shapes (Adafactor's factored moments).
    """

    def init(seed: jax.Array) -> TrainState:
        params_rng, dropout_rng, state_rng = _seeds(seed)
        batch = {k: jnp.zeros(s.shape, s.dtype) for k, s in batch_spec.items()}
        variables = model.init({"params": params_rng, "dropout": dropout_rng}, batch, train=False)
        model_state = {k: v for k, v in variables.items() if k != "params"}
        opt_state = tx.init(nn.meta.unbox(variables["params"]))
        return TrainState(variables["params"], opt_state, jnp.zeros((), jnp.int32), state_rng,
                          model_state)

    return init


def _seeds(seed: jax.Array) -> list[jax.Array]:
    """The keys a fresh state draws from its seed: parameters, dropout, the state's own."""
    return list(jax.random.split(jax.random.PRNGKey(seed), 3))


def state_from_weights(tx: optax.GradientTransformation, params: Any, model_state: Any,
                       seed: jax.Array) -> TrainState:
    """A fresh state around given weights (a weights-only checkpoint: an imported model): the
    optimizer starts as it would on these parameters, at step 0, with the RNG key a fresh
    state of this seed has."""
    return TrainState(params, tx.init(params), jnp.zeros((), jnp.int32), _seeds(seed)[2],
                      model_state)


def logical_axes(abstract_boxed_state: TrainState) -> TrainState:
    """Per leaf of the state, a ``PartitionSpec`` of logical axis names: the model's names for
    the parameters and the model state, the same names for every optimizer-state leaf of its
    parameter's shape (Adam's moments, an EMA), and none (replicated) for the rest: counters,
    and the factored moments of Adafactor, which are vectors a small fraction of their
    parameter's size."""
    boxed = abstract_boxed_state
    return TrainState(nn.get_partition_spec(boxed.params),
                      _mirrored_axes(boxed.opt_state, boxed.params),
                      PartitionSpec(), PartitionSpec(), nn.get_partition_spec(boxed.model_state))


def _mirrored_axes(opt_state: Any, boxed_params: Any) -> Any:
    """An optimizer-state leaf belongs to the parameter whose key path ends its own (Optax
    keeps per-parameter trees under its states' fields, masked or split ones included)."""
    def is_box(x: Any) -> bool:
        return isinstance(x, nn.Partitioned)

    params = {jax.tree_util.keystr(path): leaf for path, leaf in
              jax.tree_util.tree_flatten_with_path(boxed_params, is_leaf=is_box)[0]}

    def axes_of(path: tuple, leaf: Any) -> PartitionSpec:
        for start in range(len(path)):
            param = params.get(jax.tree_util.keystr(path[start:]))
            if param is not None:
                value = nn.meta.unbox(param)
                same = getattr(leaf, "shape", None) == value.shape
                return nn.get_partition_spec(param) if same and is_box(param) else PartitionSpec()
        return PartitionSpec()

    return jax.tree_util.tree_map_with_path(axes_of, opt_state)


def ema_params(state: TrainState) -> Any:
    """The exponential moving average of the parameters that the optimizer keeps when its
    ``ema_decay`` is set; None without one."""
    found = [node for node in jax.tree.leaves(state.opt_state,
                                              is_leaf=lambda x: isinstance(x, EmaState))
             if isinstance(node, EmaState)]
    return found[0].ema if found else None


def count_params(params: Any) -> int:
    return sum(int(x.size) for x in jax.tree.leaves(params))
