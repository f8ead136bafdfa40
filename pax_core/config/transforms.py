"""The two Optax transformations Pax users rely on that Optax does not have in Pax's form.

``pax_adafactor`` is Adafactor as Pax's ``ShardedAdafactor`` computes it: factored over the
last two dimensions of every parameter with at least two (not the two largest, Optax's
choice), Pax's ``adam`` and ``pow`` second-moment decays, momentum over the learning-rate
scaled update. ``track_ema`` keeps an exponential moving average of the parameters (Pax's
``ema_decay``) in the optimizer state, so it is checkpointed and sharded with the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

DECAY_METHODS = ("adam", "pow")


class AdafactorState(NamedTuple):
    """Per parameter: momentum ``m``, factored second moments ``v_row``/``v_col`` (shape
    without the last / the second-to-last dimension) or the full ``v``; the unused ones are
    one-element placeholders, as in Pax."""

    count: jax.Array
    m: Any
    v_row: Any
    v_col: Any
    v: Any


class EmaState(NamedTuple):
    count: jax.Array
    ema: Any


def second_moment_decay(method: str, rate: float, step: jax.Array) -> jax.Array:
    """The second-moment decay at a (0-based) step: ``adam`` is ``rate`` with Adam's bias
    correction folded in (0 at the first step), ``pow`` is ``1 - (step + 1) ** -rate``."""
    t = step.astype(jnp.float32) + 1.0
    if method == "adam":
        return rate * (1.0 - rate ** (t - 1.0)) / (1.0 - rate ** t)
    return 1.0 - t ** (-rate)


def _rms(x: jax.Array) -> jax.Array:
    return jnp.sqrt(jnp.mean(jnp.square(x)))


def _finite(x: jax.Array, replacement: float = 0.0) -> jax.Array:
    return jnp.nan_to_num(x, nan=replacement, posinf=replacement, neginf=replacement)


def _columns(structure: Any, rows: Any, width: int) -> list[Any]:
    """Per-parameter tuples of ``width`` values as ``width`` trees shaped like the parameters."""
    rows = list(rows)
    return [structure.unflatten([row[i] for row in rows]) for i in range(width)]


def pax_adafactor(learning_rate_at: Callable[[jax.Array], jax.Array], *, decay_method: str,
                  decay_rate: float, beta1: float, clipping_threshold: float, factored: bool,
                  epsilon1: float, multiply_by_parameter_scale: bool, epsilon2: float,
                  weight_decay: float, decay_1d: bool = True) -> optax.GradientTransformation:
    """The whole Adafactor update, learning rate and decoupled weight decay included (Pax
    applies momentum after the learning rate, so they cannot be separate links of a chain);
    ``decay_1d`` False leaves parameters of at most one dimension undecayed."""

    def is_factored(shape: tuple[int, ...]) -> bool:
        return factored and len(shape) >= 2

    def init_one(param: jax.Array) -> tuple[jax.Array, ...]:
        shape, one = param.shape, jnp.zeros((1,), jnp.float32)
        m = jnp.zeros(shape, jnp.float32) if beta1 else one
        if is_factored(shape):
            return m, jnp.zeros(shape[:-1], jnp.float32), \
                jnp.zeros(shape[:-2] + shape[-1:], jnp.float32), one
        return m, one, one, jnp.zeros(shape, jnp.float32)

    def init(params: Any) -> AdafactorState:
        structure = jax.tree.structure(params)
        return AdafactorState(jnp.zeros([], jnp.int32),
                              *_columns(structure, map(init_one, jax.tree.leaves(params)), 4))

    def update_one(count, grad, m, v_row, v_col, v, param):
        grad = _finite(grad).astype(jnp.float32)
        grad_squared = jnp.square(grad) + epsilon1
        decay = second_moment_decay(decay_method, decay_rate, count)
        learning_rate = learning_rate_at(count)
        scale = learning_rate
        if multiply_by_parameter_scale:
            scale = scale * jnp.maximum(_rms(param.astype(jnp.float32)), epsilon2)
        if is_factored(param.shape):
            v_row = decay * v_row + (1 - decay) * _finite(jnp.mean(grad_squared, axis=-1))
            v_col = decay * v_col + (1 - decay) * _finite(jnp.mean(grad_squared, axis=-2))
            row_factor = jax.lax.rsqrt(v_row / jnp.mean(v_row, axis=-1, keepdims=True))
            x = grad * row_factor[..., None] * jax.lax.rsqrt(v_col)[..., None, :]
        else:
            v = decay * v + (1 - decay) * grad_squared
            x = grad * jax.lax.rsqrt(v)
        if clipping_threshold:
            x = x / _finite(jnp.maximum(1.0, _rms(x) / clipping_threshold), 1.0)
        step = scale * x
        if beta1:
            m = _finite(beta1 * m + (1 - beta1) * step)
            step = m
        if weight_decay and (decay_1d or param.ndim > 1):
            step = step + weight_decay * learning_rate * param
        return -step.astype(param.dtype), m, v_row, v_col, v

    def update(updates, state: AdafactorState, params=None):
        if params is None:
            raise ValueError("Adafactor needs the parameters (params=...) in update()")
        structure = jax.tree.structure(params)
        per_param = zip(*(structure.flatten_up_to(tree) for tree in
                          (updates, state.m, state.v_row, state.v_col, state.v, params)),
                        strict=True)
        step, *slots = _columns(structure, (update_one(state.count, *a) for a in per_param), 5)
        return step, AdafactorState(state.count + 1, *slots)

    return optax.GradientTransformation(init, update)


def track_ema(decay: float) -> optax.GradientTransformation:
    """Leaves updates alone and keeps ``ema``, the moving average of the parameters each step
    starts from (Pax's ``ema_decay``). Its first steps use ``min(decay, (1 + n) / (10 + n))``
    after ``n`` updates, so the average is not held to the random initial values."""

    def init(params: Any) -> EmaState:
        return EmaState(jnp.zeros([], jnp.int32), jax.tree.map(jnp.copy, params))

    def update(updates, state: EmaState, params=None):
        if params is None:
            raise ValueError("the parameter EMA needs the parameters (params=...) in update()")
        n = state.count.astype(jnp.float32)
        rate = jnp.minimum(decay, (1.0 + n) / (10.0 + n))
        ema = jax.tree.map(lambda e, p: e - (1.0 - rate) * (e - p), state.ema, params)
        return updates, EmaState(state.count + 1, ema)

    return optax.GradientTransformation(init, update)
