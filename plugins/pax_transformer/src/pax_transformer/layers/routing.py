"""Routing tokens to experts: the router's choice, its auxiliary losses, and expert capacity.

Kept apart from the experts' computation (``layers/experts.py``) because the choice is made on
every token where it lives, before any token moves between devices, and because the tests
check each rule here against a reference written out by hand.

* The router scores each token against every expert (a float32 ``[d, E]`` projection), takes
  the softmax over the experts, and keeps the ``top_k`` highest; with ``normalize`` their
  weights are divided by their sum (GShard's top-2, Mixtral; the same as a softmax over the
  chosen logits), without it they stay the probabilities (DeepSeek-V2's ``norm_topk_prob``
  False).
* The load-balancing loss is Switch/GShard's ``E * sum_e f_e * P_e``: ``f_e`` the fraction of
  the token-choices that went to expert e, ``P_e`` its mean router probability. Divided by
  ``top_k`` as here, a perfectly balanced router scores 1 whatever ``top_k`` is.
* The router z-loss is ST-MoE's mean squared log-sum-exp of the router logits, which keeps
  them small enough for bfloat16.
* With a capacity factor, each *group* (one row of the batch: a sequence, so that what is
  dropped never depends on how the batch is split over devices) gives every expert
  ``capacity = max(1, ceil(capacity_factor * S / E))`` slots for its S tokens, shared by all
  of a token's choices: GShard's and praxis's convention, where 2.0 leaves top-2 routing room
  for every choice when the load is even (MaxText's counts the choices in, so its 1.0 is this
  2.0; praxis also rounds the capacity up to a multiple of 4, a TPU layout detail left out).
  Slots are handed out as GShard does for its top-2: every token's first choice in token
  order, then every token's second choice, and so on; a choice that finds its expert full is
  dropped (the token keeps its other choices and the residual).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp


class Routing(NamedTuple):
    """The router's choice for tokens ``[..., d]``: ``experts`` and ``weights`` ``[..., k]``
    (the chosen experts, best first, and their combine weights), ``probs`` ``[..., E]`` (the
    softmax over every expert) and ``logits`` ``[..., E]``."""

    experts: jax.Array
    weights: jax.Array
    probs: jax.Array
    logits: jax.Array


def route(logits: jax.Array, top_k: int, normalize: bool) -> Routing:
    """The top ``top_k`` experts of each token from its router ``logits`` [..., E]."""
    logits = logits.astype(jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    weights, experts = jax.lax.top_k(probs, top_k)
    if normalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return Routing(experts.astype(jnp.int32), weights, probs, logits)


def choice_fractions(routing: Routing) -> jax.Array:
    """``[E]``: the fraction of all token-choices that went to each expert (sums to 1)."""
    num_experts = routing.probs.shape[-1]
    counts = jnp.zeros((num_experts,), jnp.float32).at[routing.experts.reshape(-1)].add(1.0)
    return counts / routing.experts.size


def load_balancing_loss(routing: Routing) -> jax.Array:
    """``E * sum_e f_e * P_e`` (1 when balanced; the module docstring)."""
    num_experts = routing.probs.shape[-1]
    mean_probs = jnp.mean(routing.probs.reshape(-1, num_experts), axis=0)
    return num_experts * jnp.sum(choice_fractions(routing) * mean_probs)


def router_z_loss(routing: Routing) -> jax.Array:
    """The mean over tokens of ``logsumexp(logits) ** 2``."""
    return jnp.mean(jax.nn.logsumexp(routing.logits, axis=-1) ** 2)


def capacity(group_size: int, num_experts: int, capacity_factor: float) -> int:
    """Slots per expert in a group of ``group_size`` tokens."""
    return max(1, math.ceil(capacity_factor * group_size / num_experts))


def capacity_slots(experts: jax.Array, num_experts: int, slots: int) -> tuple[jax.Array,
                                                                               jax.Array]:
    """For ``experts`` [G, S, k] (each group's tokens' choices): each choice's position among
    its expert's slots ``[G, S, k]``, and whether it got one (position < ``slots``), in the
    order of the module docstring: choice by choice, token by token within a choice."""
    groups, size, k = experts.shape
    choice_major = experts.swapaxes(1, 2).reshape(groups, k * size)
    onehot = jax.nn.one_hot(choice_major, num_experts, dtype=jnp.int32)
    before = jnp.cumsum(onehot, axis=1) - onehot  # choices ahead of this one, per expert
    position = jnp.take_along_axis(before, choice_major[..., None], axis=-1)[..., 0]
    position = position.reshape(groups, k, size).swapaxes(1, 2)
    return position, position < slots
