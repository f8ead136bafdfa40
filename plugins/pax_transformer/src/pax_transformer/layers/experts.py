"""The experts' computation: tokens to their experts, through them, and back, two ways.

* **Capacity** (GShard): each group's choices that got a slot (``routing.capacity_slots``)
  are scattered into an ``[E, C, d]`` buffer per group, every expert runs on its ``C`` slots
  (one batched matmul), and each token gathers its choices' outputs back. Under expert
  parallelism the buffers go to their experts' devices and back with two all-to-alls over the
  expert axis.
* **Dropless**: every choice is kept. The choices are sorted by expert and each expert
  multiplies its contiguous run of tokens (``jax.lax.ragged_dot``, a grouped matmul), so the
  work is exactly the chosen experts'. Under expert parallelism every device of the expert
  axis gathers the tokens of that axis, runs its own experts on the choices that went to them,
  and the partial outputs are summed back onto the devices the tokens came from (a
  reduce-scatter): the all-gather dispatch, whose messages do not depend on how the router
  chose, so shapes stay static.

Both are plain functions of the tokens ``x`` [G, S, d], this device's ``ExpertWeights`` and
the router's per-token choice (``[G, S, k]`` arrays). ``expert_axis`` and ``mlp_axis`` name
the mesh axes the experts and their hidden units are split over inside a ``shard_map``
(``layers/moe.py`` decides); None means the arrays are whole, as on one device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp


class ExpertWeights(NamedTuple):
    """``wi`` (and ``wi_gate``) ``[E, d, f]`` and ``wo`` ``[E, f, d]``, this device's part."""

    wi: jax.Array
    wi_gate: jax.Array | None
    wo: jax.Array


def _hidden(act: Callable[[jax.Array], jax.Array], up: jax.Array, gate: jax.Array | None
            ) -> jax.Array:
    return act(up) if gate is None else act(gate) * up


def _summed_over(x: jax.Array, axis: Any) -> jax.Array:
    return x if axis is None else jax.lax.psum(x, axis)


def capacity_compute(x: jax.Array, w: ExpertWeights, experts: jax.Array, weights: jax.Array,
                     position: jax.Array, kept: jax.Array, *,
                     act: Callable[[jax.Array], jax.Array], slots: int,
                     expert_axis: str | None = None, mlp_axis: Any = None) -> jax.Array:
    """``[G, S, d]`` tokens through the experts with ``slots`` per expert and group; a dropped
    choice adds nothing. ``experts``, ``weights``, ``position`` and ``kept`` are ``[G, S, k]``."""
    groups, size, d = x.shape
    k = experts.shape[-1]
    num_experts = w.wi.shape[0] * (1 if expert_axis is None else jax.lax.axis_size(expert_axis))
    trash = num_experts * slots  # where a dropped choice is written, and read as zero
    slot = jnp.where(kept, experts * slots + position, trash).reshape(groups, size * k)
    choices = jnp.repeat(x, k, axis=1)  # [G, S*k, d], token by token, choice by choice

    def scatter(slot_g, choices_g):
        return jnp.zeros((trash + 1, d), x.dtype).at[slot_g].set(choices_g)[:trash]

    buffers = jax.vmap(scatter)(slot, choices).reshape(groups, num_experts, slots, d)
    if expert_axis is not None:  # to the experts' devices: [G * ep, E / ep, C, d]
        buffers = jax.lax.all_to_all(buffers, expert_axis, 1, 0, tiled=True)
    hidden = _hidden(act, jnp.einsum("gecd,edf->gecf", buffers, w.wi),
                     None if w.wi_gate is None
                     else jnp.einsum("gecd,edf->gecf", buffers, w.wi_gate))
    out = jnp.einsum("gecf,efd->gecd", hidden, w.wo)
    if expert_axis is not None:  # and back: [G, E, C, d]
        out = jax.lax.all_to_all(out, expert_axis, 0, 1, tiled=True)
    out = jnp.concatenate([out.reshape(groups, trash, d), jnp.zeros((groups, 1, d), out.dtype)],
                          axis=1)
    gathered = jax.vmap(lambda out_g, slot_g: out_g[slot_g])(out, slot)  # [G, S*k, d]
    combined = jnp.einsum("gskd,gsk->gsd", gathered.reshape(groups, size, k, d),
                          weights.astype(out.dtype))
    return _summed_over(combined, mlp_axis)


def dropless_compute(x: jax.Array, w: ExpertWeights, experts: jax.Array, weights: jax.Array,
                     *, act: Callable[[jax.Array], jax.Array], expert_axis: str | None = None,
                     mlp_axis: Any = None) -> jax.Array:
    """``[G, S, d]`` tokens through every chosen expert (``experts``, ``weights``
    ``[G, S, k]``), with a grouped matmul over the choices sorted by expert."""
    local_experts = w.wi.shape[0]
    if expert_axis is not None:  # every token of the expert axis, for this device's experts
        x, experts, weights = (jax.lax.all_gather(a, expert_axis, axis=0, tiled=True)
                               for a in (x, experts, weights))
        first = jax.lax.axis_index(expert_axis) * local_experts
    else:
        first = 0
    shape, d, k = x.shape, x.shape[-1], experts.shape[-1]
    tokens = x.reshape(-1, d)
    mine = (experts >= first) & (experts < first + local_experts)
    # Choices of other devices' experts sort last, past every group, where ragged_dot leaves
    # zeros.
    key = jnp.where(mine, experts - first, local_experts).reshape(-1)
    order = jnp.argsort(key, stable=True)
    sizes = jnp.zeros((local_experts + 1,), jnp.int32).at[key].add(1)[:local_experts]
    sorted_tokens = tokens[order // k]
    hidden = _hidden(act, jax.lax.ragged_dot(sorted_tokens, w.wi, sizes),
                     None if w.wi_gate is None
                     else jax.lax.ragged_dot(sorted_tokens, w.wi_gate, sizes))
    out_sorted = jax.lax.ragged_dot(hidden, w.wo, sizes)
    out = jnp.zeros_like(out_sorted).at[order].set(out_sorted).reshape(*shape[:-1], k, d)
    gates = jnp.where(mine, weights, 0.0).astype(out.dtype)
    combined = jnp.einsum("gskd,gsk->gsd", out, gates)
    if expert_axis is not None:  # each device's experts' share, summed onto the tokens' device
        combined = jax.lax.psum_scatter(combined, expert_axis, scatter_dimension=0, tiled=True)
    return _summed_over(combined, mlp_axis)
