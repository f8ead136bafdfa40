"""The least code a user would write to train an experiment's model: jit, value_and_grad, optax.

Same model, optimizer and batches as ``pax train`` (all three are built from the experiment's
config), none of the framework's loop. Prints one JSON line: tokens/s of each interval of
``--warmup`` steps after the first, the first step's time (compile included) and the losses.

    python bench/bare_loop.py --exp lm/QuickStartLm --steps 60 --warmup 10 [--set K=V ...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax

from pax_core.config.resolve import resolve
from pax_core.plugins.host import PluginHost


def bare_step(model: Any, tx: optax.GradientTransformation) -> Callable[..., tuple]:
    """``(params, opt_state, batch, rng) -> (params, opt_state, rng, loss)``: the model's loss,
    its gradient and one optimizer update, as a user writes it (``step_hlo.py`` compares its
    compiled program with Pax's train step)."""
    def loss_fn(params, batch, rng):
        return model.apply({"params": params}, batch, train=True, rngs={"dropout": rng}).loss

    def train_step(params, opt_state, batch, rng):
        rng, step_rng = jax.random.split(rng)
        loss, grads = jax.value_and_grad(loss_fn)(params, batch, step_rng)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, rng, loss

    return train_step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exp", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--set", dest="set_items", action="append", default=[])
    args = parser.parse_args()

    job = resolve(PluginHost(), args.exp, None, args.set_items).build()
    model = job.task.model
    tx = job.task.train.learner.optimizer.build()
    data = next(d for d in job.datasets if d.is_training)
    data.shard(0, 1)

    first = data.get_next()
    params = model.init(jax.random.key(0), first, train=False)["params"]
    opt_state = tx.init(params)
    rng = jax.random.key(1)
    train_step = jax.jit(bare_step(model, tx))

    tokens_per_step = int(np.prod(first["ids"].shape))
    batch, losses, times = first, {}, {}
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        params, opt_state, rng, loss = train_step(params, opt_state, batch, rng)
        if step == 1:
            jax.block_until_ready(loss)
            first_step_sec = time.perf_counter() - start
        if step % args.warmup == 0:
            losses[step] = float(loss)
            times[step] = time.perf_counter()
        if step < args.steps:
            batch = data.get_next()
    marks = sorted(times)
    print(json.dumps({
        "interval_tokens_per_sec": [args.warmup * tokens_per_step / (times[b] - times[a])
                                    for a, b in itertools.pairwise(marks)],
        "first_step_sec": first_step_sec,
        "losses": losses,
    }))


if __name__ == "__main__":
    main()
