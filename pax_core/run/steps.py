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

from pax_core.models.output import ModelOutput
from pax_core.parallel.partitioner import Reduction
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


def make_train_step(model: nn.Module, tx: optax.GradientTransformation,
                    learning_rate_at: Callable[[jax.Array], jax.Array],
                    num_microbatches: int = 1, reduction: Reduction | None = None,
                    skip_anomalies: bool = False) -> Callable[..., tuple[TrainState, dict]]:
    """``(state, batch) -> (state, metrics)``: gradients (accumulated over microbatches when
    asked, and combined across shards by ``reduction`` when the step runs per shard), one
    optimizer update, and the step's loss, learning rate and gradient norm.

    ``anomalous`` in the metrics is 1 when the loss or the gradient norm is not finite; with
    ``skip_anomalies`` such a step keeps the old parameters and optimizer state."""
    reduction = reduction or Reduction()

    def grads_of(params, batch, rng):
        def loss_fn(p):
            out: ModelOutput = model.apply({"params": p}, batch, train=True,
                                           rngs={"dropout": rng})
            return out.loss, out

        (_, out), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        return grads, out

    def accumulate(params, batch, rng):
        def body(acc, xs):
            mb, mb_rng = xs
            grads, out = grads_of(params, mb, mb_rng)
            return jax.tree.map(jnp.add, acc, grads), out

        zeros = jax.tree.map(jnp.zeros_like, params)
        rngs = jax.random.split(rng, num_microbatches)
        summed, outs = jax.lax.scan(body, zeros, (_microbatches(batch, num_microbatches), rngs))
        grads = jax.tree.map(lambda g: g / num_microbatches, summed)
        metrics = {k: (v.reshape(-1), None if w is None else w.reshape(-1))
                   for k, (v, w) in outs.metrics.items()}
        return grads, ModelOutput(jnp.mean(outs.loss), metrics, jnp.sum(outs.num_tokens))

    def combined(grads, out: ModelOutput):
        """Gradients and metrics of the whole batch from this shard's."""
        grads, loss = reduction.gradients(grads), reduction.mean(out.loss)
        sums, tokens = reduction.sum((_weighted_sums(out.metrics),
                                      jnp.asarray(out.num_tokens, jnp.float32)))
        return grads, loss, _means(sums), tokens

    def train_step(state: TrainState, batch: dict[str, jax.Array]):
        rng, step_rng = jax.random.split(state.rng)
        if num_microbatches > 1:
            grads, out = accumulate(state.params, batch, step_rng)
        else:
            grads, out = grads_of(state.params, batch, step_rng)
        grads, loss, means, tokens = combined(grads, out)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        if skip_anomalies:
            params, opt_state = jax.tree.map(lambda new, old: jnp.where(finite, new, old),
                                             (params, opt_state), (state.params, state.opt_state))
        metrics = {
            "loss": loss,
            **means,
            "learning_rate": learning_rate_at(state.step),
            "grad_norm": grad_norm,
            "num_tokens": tokens,
            "anomalous": 1.0 - finite.astype(jnp.float32),
        }
        return TrainState(params, opt_state, state.step + 1, rng), metrics

    return train_step


def make_eval_step(model: nn.Module, reduction: Reduction | None = None
                   ) -> Callable[..., dict[str, tuple[jax.Array, jax.Array]]]:
    """``(params, batch) -> sums``: weighted sums (not means), so that the loop can add them over
    eval batches on the device and divide once at the end."""
    reduction = reduction or Reduction()

    def eval_step(params, batch):
        out: ModelOutput = model.apply({"params": params}, batch, train=False)
        loss = reduction.mean(out.loss)
        return {"loss": (loss, jnp.ones(())), **reduction.sum(_weighted_sums(out.metrics))}

    return eval_step
