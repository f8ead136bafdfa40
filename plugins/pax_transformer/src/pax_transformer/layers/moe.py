"""``MoeFeedForward``: a Mixture-of-Experts feed-forward part, with expert parallelism.

A drop-in for ``FeedForward`` in a block (``layers/parts.py``): ``feed_forward=fdl.Partial(
MoeFeedForward, num_experts=8, top_k=2)`` makes every layer sparse, the block completing the
template with its widths, activation and dtypes. Each token goes to ``top_k`` of
``num_experts`` feed-forwards of ``hidden_dims`` units (``layers/routing.py`` says how they
are chosen), through one of two computations (``layers/experts.py``):

* ``capacity_factor`` None: dropless, every choice computed (Mixtral, DeepSeek, MaxText's
  default);
* ``capacity_factor`` > 0: GShard's, each expert taking at most its capacity of a sequence's
  token-choices, the rest dropped (praxis's ``TransformerFeedForwardMoe``; 2.0 is room for
  top-2 routing's every choice when the load is even).

``shared_experts`` > 0 adds a dense feed-forward of ``shared_experts * hidden_dims`` units that
every token goes through (DeepSeek's shared experts).

Expert parallelism is the partitioner's, not the model's: the experts' weights carry the
logical axis ``experts``, and when the axis rules in force map it onto a mesh axis of more
than one device (``pax_core.axes.EXPERT_RULES``: the ``expert`` axis), the layer runs its
experts inside a ``shard_map`` over the mesh, each device holding its share of the experts,
with the tokens moved by collectives over that axis. The batch must then be split over the
expert axis too (so that each device brings its own tokens), which those rules do.

Weights (E = num_experts, d = model dims, f = hidden_dims)::

    router/kernel       [d, E]     ("embed", None)      float32 scores
    wi, wi_gate         [E, d, f]  ("experts", "embed", "mlp")   wi_gate when gated
    wo                  [E, f, d]  ("experts", "mlp", "embed")
    shared/...          a FeedForward's                  shared_experts > 0

The part returns ``(output, stats)``: ``stats`` holds ``aux_loss`` (what it adds to the
training loss: ``load_balancing_weight`` x the load-balancing loss + ``z_loss_weight`` x the
router z-loss), the two losses themselves, ``expert_load`` ([E], the share of token-choices
each expert got) and ``dropped_fraction`` (the share of choices dropped for capacity). The
block hands them up the stack; ``TransformerLm`` averages them over its sparse layers. Padding
tokens are routed and counted like the others.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.typing import Initializer
from jax.sharding import PartitionSpec

from pax_core import UsageError, axes
from pax_transformer.layers.experts import ExpertWeights, capacity_compute, dropless_compute
from pax_transformer.layers.feedforward import ACTIVATIONS, FeedForward
from pax_transformer.layers.initializers import partitioned
from pax_transformer.layers.lora import Lora
from pax_transformer.layers.routing import (
    capacity,
    capacity_slots,
    choice_fractions,
    load_balancing_loss,
    route,
    router_z_loss,
)
from pax_transformer.layers.validation import check_choice

PATH = "ffn"
IN_AXES = (axes.EXPERTS, axes.EMBED, axes.MLP)
OUT_AXES = (axes.EXPERTS, axes.MLP, axes.EMBED)
TOKEN_AXES = (axes.BATCH, axes.LENGTH, None)


def _per_expert(init: Initializer) -> Initializer:
    """``init`` applied to each expert's ``[in, out]`` matrix on its own, so that its scale
    is a dense layer's (an initialiser given ``[E, in, out]`` would count E into the fan-in)."""

    def wrapped(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        return jax.vmap(lambda k: init(k, shape[1:], dtype))(jax.random.split(key, shape[0]))

    return wrapped


def check_moe(num_experts: int, top_k: int, capacity_factor: float | None,
              shared_experts: int, load_balancing_weight: float, z_loss_weight: float) -> None:
    """Raise ValueError for MoE settings that cannot build, saying what would."""
    if num_experts < 1:
        raise ValueError(f"num_experts must be a positive integer, got {num_experts}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k={top_k} must be between 1 and num_experts={num_experts} "
                         f"(each token goes to top_k of the experts)")
    if capacity_factor is not None and not capacity_factor > 0:
        raise ValueError(f"capacity_factor must be positive (GShard: 1.25 or 2.0) or None "
                         f"(dropless), got {capacity_factor}")
    if shared_experts < 0:
        raise ValueError(f"shared_experts must be 0 (none) or positive, got {shared_experts}")
    for name, value in (("load_balancing_weight", load_balancing_weight),
                        ("z_loss_weight", z_loss_weight)):
        if value < 0:
            raise ValueError(f"{name} must be 0 (off) or positive, got {value}")


class MoeFeedForward(nn.Module):
    """[B, L, d] -> ([B, L, d], stats) through ``top_k`` of ``num_experts`` feed-forwards
    (the module docstring)."""

    num_experts: int
    hidden_dims: int
    kernel_init: Initializer
    top_k: int = 2
    capacity_factor: float | None = None
    normalize_top_k: bool = True
    shared_experts: int = 0
    load_balancing_weight: float = 0.01
    z_loss_weight: float = 0.0
    activation: str = "relu"
    gated: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    fp8_amax_history: int = 0
    lora: Lora | None = None
    train: bool = False

    def __post_init__(self) -> None:
        check_moe(self.num_experts, self.top_k, self.capacity_factor, self.shared_experts,
                  self.load_balancing_weight, self.z_loss_weight)
        if self.fp8_amax_history:
            raise ValueError("fp8 does not run the experts of MoeFeedForward; turn fp8 off")
        if self.lora is not None and any(self.lora.adapts(f"{PATH}/{name}")
                                         for name in ("wi", "wi_gate", "wo")):
            raise ValueError("LoRA adapters on the experts of MoeFeedForward are not "
                             "supported; target attention's projections only")
        super().__post_init__()

    @nn.nowrap
    def _shared(self) -> FeedForward | None:
        if not self.shared_experts:
            return None
        return FeedForward(self.shared_experts * self.hidden_dims, self.kernel_init,
                           self.activation, self.gated, dtype=self.dtype,
                           param_dtype=self.param_dtype, train=self.train, name="shared")

    @nn.nowrap
    def _expert_weights(self, model_dims: int) -> int:
        """One expert's weights."""
        return (3 if self.gated else 2) * model_dims * self.hidden_dims

    @nn.nowrap
    def num_weights(self, model_dims: int) -> int:
        """The router's, every expert's and the shared experts'."""
        shared = self._shared()
        return (model_dims * self.num_experts + self.num_experts * self._expert_weights(model_dims)
                + (shared.num_weights(model_dims) if shared else 0))

    @nn.nowrap
    def active_weights(self, model_dims: int) -> int:
        """The weights one token multiplies: the router's, its ``top_k`` experts' and the
        shared experts'."""
        shared = self._shared()
        return (model_dims * self.num_experts + self.top_k * self._expert_weights(model_dims)
                + (shared.num_weights(model_dims) if shared else 0))

    @nn.nowrap
    def train_flops_per_token(self, model_dims: int, seq_len: int) -> float:
        """6 per active weight (the capacity's dropped or padded slots are not counted)."""
        del seq_len
        return float(6 * self.active_weights(model_dims))

    def _kernel(self, name: str, shape: tuple[int, ...], names: tuple[str, ...]) -> jax.Array:
        init = partitioned(_per_expert(self.kernel_init), names)
        return self.param(name, init, shape, self.param_dtype).astype(self.dtype)

    @nn.compact
    def __call__(self, x: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        check_choice("activation", self.activation, ACTIVATIONS)
        d, e, f = x.shape[-1], self.num_experts, self.hidden_dims
        router = self.param("router", partitioned(self.kernel_init, (axes.EMBED, None)),
                            (d, e), self.param_dtype)
        routing = route(jnp.einsum("bld,de->ble", x.astype(jnp.float32),
                                   router.astype(jnp.float32)), self.top_k,
                        self.normalize_top_k)
        weights = ExpertWeights(
            self._kernel("wi", (e, d, f), IN_AXES),
            self._kernel("wi_gate", (e, d, f), IN_AXES) if self.gated else None,
            self._kernel("wo", (e, f, d), OUT_AXES))
        x = x.astype(self.dtype)
        act = ACTIVATIONS[self.activation]
        if self.capacity_factor is None:
            compute = functools.partial(dropless_compute, act=act)
            per_token = (routing.experts, routing.weights)
            dropped = jnp.zeros((), jnp.float32)
        else:
            slots = capacity(x.shape[1], e, self.capacity_factor)
            position, kept = capacity_slots(routing.experts, e, slots)
            compute = functools.partial(capacity_compute, act=act, slots=slots)
            per_token = (routing.experts, routing.weights, position, kept)
            dropped = jnp.mean(jnp.logical_not(kept).astype(jnp.float32))
        out = _on_their_devices(compute, x, weights, per_token)
        shared = self._shared()
        if shared is not None:
            out = out + shared(x)
        balance, z = load_balancing_loss(routing), router_z_loss(routing)
        stats = {"aux_loss": self.load_balancing_weight * balance + self.z_loss_weight * z,
                 "load_balancing_loss": balance, "router_z_loss": z,
                 "expert_load": choice_fractions(routing), "dropped_fraction": dropped}
        return nn.with_logical_constraint(out, (axes.BATCH, axes.LENGTH, axes.EMBED)), stats


def _on_their_devices(compute: Callable[..., jax.Array], x: jax.Array, w: ExpertWeights,
                      per_token: tuple[jax.Array, ...]) -> jax.Array:
    """``compute(x, w, *per_token)`` here, or, with the experts split over a mesh axis,
    inside a ``shard_map`` over the mesh that gives each device its tokens and its experts
    and tells ``compute`` the axes to move them over."""
    expert_axis, mlp_axis = _mesh_axes()
    if expert_axis is None:
        return compute(x, w, *per_token)
    devices = jax.sharding.get_abstract_mesh().shape[expert_axis]
    if w.wi.shape[0] % devices:  # the mesh and rules are the run's: a usage mistake
        raise UsageError(f"{w.wi.shape[0]} experts do not divide over the {devices} devices of "
                         f"mesh axis '{expert_axis}'; use a multiple of {devices} experts")
    tokens = nn.logical_to_mesh_axes(TOKEN_AXES)
    split = tokens[0] if isinstance(tokens[0], tuple) else (tokens[0],)
    if expert_axis not in split:
        raise UsageError(f"the experts are split over mesh axis '{expert_axis}' but the batch "
                         f"is not; map 'batch' onto it too in LOGICAL_AXIS_RULES "
                         f"(pax_core.axes.EXPERT_RULES does)")
    specs = ExpertWeights(PartitionSpec(expert_axis, None, mlp_axis),
                          None if w.wi_gate is None
                          else PartitionSpec(expert_axis, None, mlp_axis),
                          PartitionSpec(expert_axis, mlp_axis, None))
    body = functools.partial(compute, expert_axis=expert_axis, mlp_axis=mlp_axis)
    return jax.shard_map(body, in_specs=(tokens, specs, *(tokens for _ in per_token)),
                         out_specs=tokens, check_vma=False)(x, w, *per_token)


def _mesh_axes() -> tuple[str | None, Any]:
    """The mesh axis the experts are split over (None: they are not, or over one device) and
    the one their hidden units are split over, by the axis rules and mesh in force."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return None, None
    expert_axis, _, mlp_axis = nn.logical_to_mesh_axes(IN_AXES)
    if isinstance(expert_axis, tuple):
        if len(expert_axis) != 1:
            raise UsageError(f"the experts can be split over one mesh axis, not "
                             f"{list(expert_axis)}; map 'experts' onto one in the rules")
        expert_axis = expert_axis[0]
    if expert_axis is None or mesh.shape[expert_axis] == 1:
        return None, None
    return expert_axis, mlp_axis
