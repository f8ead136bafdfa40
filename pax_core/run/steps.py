"""The jitted computations of a run: one train step and one eval step.

Metrics stay on the device: the step returns scalars and the loop decides when to read them,
so nothing here forces a device-to-host copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT

from pax_core.models.output import ModelOutput
from pax_core.parallel.partitioner import Reduction, reducing_with
from pax_core.run.state import TrainState


def _weighted_sums(metrics: dict[str, tuple[Any, Any]]) -> dict[str, tuple[jax.Array, Any]]:
    """``(sum of value x weight, sum of weight)`` per metric; a count (weight None) is summed."""
    return {k: (jnp.sum(v), None) if w is None else (jnp.sum(v * w), jnp.sum(w))
            for k, (v, w) in metrics.items()}


def _means(sums: dict[str, tuple[jax.Array, Any]]) -> dict[str, jax.Array]:
    return {k: total if weight is None else total / jnp.maximum(weight, 1e-9)
            for k, (total, weight) in sums.items()}


def _microbatches(batch: dict[str, jax.Array], k: int) -> dict[str, jax.Array]:
    """Split ``[B, ...]`` into ``[k, B/k, ...]`` taking every k-th row, so that each device's
    contiguous rows stay on that device (no data moves between devices)."""
    return {
        name: x.reshape((x.shape[0] // k, k, *x.shape[1:])).swapaxes(0, 1)
        for name, x in batch.items()
    }


def _agreed(reduction: Reduction, model_state: dict[str, Any]) -> dict[str, Any]:
    """The model state every shard keeps: float leaves (moving statistics) averaged across
    shards, integer leaves (counters) as they are, since they are equal already; and the
    collection overwritten with its gradient (FP8 scales and amax histories) at its maximum,
    since each shard saw only its rows' largest value and the scales are equal already."""
    def mean_floats(x):
        return reduction.mean(x) if jnp.issubdtype(x.dtype, jnp.floating) else x

    return {name: reduction.max(tree) if name == OVERWRITE_WITH_GRADIENT
            else jax.tree.map(mean_floats, tree) for name, tree in model_state.items()}


def make_train_step(model: nn.Module, tx: optax.GradientTransformation,
                    learning_rate_at: Callable[[jax.Array], jax.Array],
                    num_microbatches: int = 1, reduction: Reduction | None = None,
                    skip_anomalies: bool = False,
                    trained: Callable[[Any], Any] | None = None,
                    ) -> Callable[..., tuple[TrainState, dict]]:
    """``(state, batch) -> (state, metrics)``: gradients (accumulated over microbatches when
    asked, and combined across shards by ``reduction`` when the step runs per shard), one
    optimizer update, the model state the forward pass updated (batch norm's statistics, one
    microbatch after another), and the step's loss, learning rate and gradient norm.

    ``anomalous`` in the metrics is 1 when the loss or the gradient norm is not finite; with
    ``skip_anomalies`` such a step keeps the old parameters, optimizer and model state.

    The model-state collection ``OVERWRITE_WITH_GRADIENT`` (Flax's FP8 scales and amax
    histories) is differentiated beside the parameters and replaced by its gradient, which
    Flax's FP8 operations define as the variable's next value; the optimizer never sees it.
    Microbatches chain it as they chain batch norm's statistics: each starts from the value
    the one before left.

    ``trained`` maps the parameters to a tree of booleans (``Learner`` freezing some): the
    backward pass stops at the frozen ones, whose gradients are zero."""
    reduction = reduction or Reduction()

    def frozen_stopped(params):
        if trained is None:
            return params
        return jax.tree.map(lambda p, t: p if t else jax.lax.stop_gradient(p), params,
                            trained(params))

    def grads_of(params, model_state, batch, rng):
        overwritten = model_state.get(OVERWRITE_WITH_GRADIENT)
        mutable = [name for name in model_state if name != OVERWRITE_WITH_GRADIENT]

        def loss_fn(p, overwritten):
            variables = {"params": frozen_stopped(p), **model_state}
            if overwritten is not None:
                variables[OVERWRITE_WITH_GRADIENT] = overwritten
            with reducing_with(reduction):
                out, updated = model.apply(variables, batch, train=True, rngs={"dropout": rng},
                                           mutable=mutable)
            return out.loss, (out, updated)

        (_, (out, updated)), (grads, next_values) = jax.value_and_grad(
            loss_fn, argnums=(0, 1), has_aux=True)(params, overwritten)
        model_state = {**model_state, **updated}
        if overwritten is not None:
            model_state[OVERWRITE_WITH_GRADIENT] = next_values
        return grads, out, model_state

    def accumulate(params, model_state, batch, rng):
        def body(carry, xs):
            acc, model_state = carry
            mb, mb_rng = xs
            grads, out, model_state = grads_of(params, model_state, mb, mb_rng)
            return (jax.tree.map(jnp.add, acc, grads), model_state), out

        zeros = jax.tree.map(jnp.zeros_like, params)
        rngs = jax.random.split(rng, num_microbatches)
        (summed, model_state), outs = jax.lax.scan(
            body, (zeros, model_state), (_microbatches(batch, num_microbatches), rngs))
        grads = jax.tree.map(lambda g: g / num_microbatches, summed)
        metrics = {k: (v.reshape(-1), None if w is None else w.reshape(-1))
                   for k, (v, w) in outs.metrics.items()}
        out = ModelOutput(jnp.mean(outs.loss), metrics, jnp.sum(outs.num_tokens))
        return grads, out, model_state

    def combined(grads, out: ModelOutput):
        """Gradients and metrics of the whole batch from this shard's."""
        grads, loss = reduction.gradients(grads), reduction.mean(out.loss)
        sums, tokens = reduction.sum((_weighted_sums(out.metrics),
                                      jnp.asarray(out.num_tokens, jnp.float32)))
        return grads, loss, _means(sums), tokens

    def train_step(state: TrainState, batch: dict[str, jax.Array]):
        rng, step_rng = jax.random.split(state.rng)
        compute = accumulate if num_microbatches > 1 else grads_of
        grads, out, model_state = compute(state.params, state.model_state, batch, step_rng)
        model_state = _agreed(reduction, model_state)
        grads, loss, means, tokens = combined(grads, out)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if skip_anomalies:
            params, opt_state, model_state = jax.tree.map(
                lambda new, old: jnp.where(finite, new, old), (params, opt_state, model_state),
                (state.params, state.opt_state, state.model_state))
        metrics = {
            "loss": loss,
            **means,
            "learning_rate": learning_rate_at(state.step),
            "grad_norm": grad_norm,
            "num_tokens": tokens,
            "anomalous": 1.0 - finite.astype(jnp.float32),
        }
        return TrainState(params, opt_state, state.step + 1, rng, model_state), metrics

    return train_step


def make_eval_step(model: nn.Module, reduction: Reduction | None = None
                   ) -> Callable[..., dict[str, tuple[jax.Array, jax.Array]]]:
    """``(variables, batch) -> sums``: weighted sums (not means), so that the loop can add them
    over eval batches on the device and divide once at the end. ``variables`` are the model's
    (``Run.eval_variables``: the parameters it evaluates and its model state)."""
    reduction = reduction or Reduction()

    def eval_step(variables, batch):
        with reducing_with(reduction):
            out: ModelOutput = model.apply(variables, batch, train=False)
        loss = reduction.mean(out.loss)
        return {"loss": (loss, jnp.ones(())), **reduction.sum(_weighted_sums(out.metrics))}

    return eval_step
