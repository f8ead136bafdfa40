"""The train step alone, without any loop: where a step's time goes, on CPU in float32.

In one process, on the same batches and from the same weights, these programs run interleaved
(two steps each, many rounds; the median is reported):

* hand: `handwritten.py`'s model and optimizer in one jitted step;
* hand-einsum: the same with attention written as two einsums and a softmax, to compare with
  `jax.nn.dot_product_attention` on this platform;
* bare: Pax's model (pax-transformer and pax-lm's loss and metrics) in that plain step, so
  bare / hand is what Pax's layers cost;
* pax: `pax train`'s compiled step (`Run.compile_train_step`: metrics, gradient norm, the
  anomaly check), data-parallel on one device as the experiment declares no mesh;
* pax-spmd: the same under the SPMD partitioner on a 1x1x1 mesh, where the model's logical
  sharding constraints are in force.

    python bench/step_speed.py [--models quickstart,llama25m,lm50m] [--rounds 8]

Writes bench/results/step_speed.json and step_speed.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.pop("XLA_FLAGS", None)

import handwritten
import jax
import jax.numpy as jnp
import optax
import report
import same_math
from train_speed import MODELS

from pax_core.config.resolve import resolve
from pax_core.plugins.host import PluginHost
from pax_core.run.build import build_run

KEYS = ("ids", "labels", "weights", "segment_ids", "segment_pos")


def einsum_attention(q, k, v, mask, is_causal):
    """Softmax attention as a user writes it with einsums (float32 logits)."""
    logits = jnp.einsum("bqnh,bknh->bnqk", q, k) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
    length = q.shape[1]
    causal = jnp.tril(jnp.ones((length, length), bool))
    logits = jnp.where(mask & causal, logits, jnp.finfo(logits.dtype).min)
    return jnp.einsum("bnqk,bknh->bqnh", jax.nn.softmax(logits, axis=-1), v)


def hand_step(model: handwritten.Decoder, tx: optax.GradientTransformation):
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p: handwritten.loss_fn(model, p, batch))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step)


def programs(exp: str) -> tuple[dict[str, tuple], list]:
    """Each program as (compiled step, its first arguments, how to take the next ones)."""
    host = PluginHost()
    run = build_run(host, resolve(host, exp, None, []), jax.devices()[:1])
    model = run.task.model
    config = same_math.hand_config(model.decoder, run.task.train.learner.optimizer)
    batches = [run.partitioner.global_batch(run.train_input.get_next()) for _ in range(2)]
    state = run.init_state()
    hand_params = same_math.renamed(jax.device_get(state.params["decoder"]))
    tx = handwritten.optimizer(config)
    found = {}

    def plain(name, params, loss):
        step = jax.jit(lambda p, o, b: _plain(loss, tx, p, o, b))
        opt_state = tx.init(params)
        found[name] = (step.lower(params, opt_state, batches[0]).compile(), (params, opt_state))

    hand = handwritten.Decoder(config)
    plain("hand", hand_params, lambda p, b: handwritten.loss_fn(hand, p, b))
    original = jax.nn.dot_product_attention
    jax.nn.dot_product_attention = einsum_attention
    try:
        plain("hand-einsum", hand_params, lambda p, b: handwritten.loss_fn(hand, p, b))
    finally:
        jax.nn.dot_product_attention = original
    plain("bare", state.params, lambda p, b: model.apply({"params": p}, b, train=True).loss)
    found["pax"] = (run.compile_train_step(donate_state=False), (state,))
    spmd = build_run(host, resolve(host, exp, None, ["ICI_MESH_SHAPE=[1,1,1]"]),
                     jax.devices()[:1])
    found["pax-spmd"] = (spmd.compile_train_step(donate_state=False), (spmd.init_state(),))
    return found, batches


def _plain(loss, tx, params, opt_state, batch):
    value, grads = jax.value_and_grad(loss)(params, batch)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, value


def two_steps(compiled, start: tuple, batches: list) -> float:
    """Seconds per step over two steps from ``start``."""
    started = time.perf_counter()
    args = start
    for batch in batches:
        if len(start) == 1:  # pax: (state, batch) -> (state, metrics)
            out = compiled(args[0], batch)
            args = out[:1]
        else:
            batch = {k: batch[k] for k in KEYS if k in batch}
            out = compiled(*args, batch)
            args = out[:2]
    jax.block_until_ready(out)
    return (time.perf_counter() - started) / len(batches)


def bench_model(name: str, rounds: int) -> dict:
    found, batches = programs(MODELS[name].exp)
    for compiled, start in found.values():  # the first execution's one-off costs
        two_steps(compiled, start, batches)
    times = {program: [] for program in found}
    for r in range(rounds):
        order = list(found) if r % 2 == 0 else list(reversed(found))
        for program in order:
            times[program].append(two_steps(*found[program], batches))
    median = {program: statistics.median(t) for program, t in times.items()}
    print(f"  {MODELS[name].name}: " + ", ".join(f"{p} {1e3 * t:,.1f} ms"
                                                  for p, t in median.items()), flush=True)
    return {"model": MODELS[name].name, "rounds": rounds, "step_sec": median, "samples": times}


def markdown(summary: dict) -> str:
    lines = ["# The train step alone: `pax train`'s step against hand-written flax + optax", "",
             f"{summary['machine']}; one CPU device, float32; median step time over "
             f"interleaved rounds of two steps; speed relative to hand (higher is faster).", "",
             "| model | hand (ms) | hand-einsum | bare | pax | pax-spmd |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for m in summary["models"]:
        t = m["step_sec"]
        cells = [f"{1e3 * t['hand']:,.1f}"] + [
            f"{1e3 * t[p]:,.1f} ({t['hand'] / t[p]:.3f})"
            for p in ("hand-einsum", "bare", "pax", "pax-spmd")]
        lines.append(f"| {m['model']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    models = [bench_model(name, args.rounds) for name in args.models.split(",")]
    summary = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} "
                          f"cores", "models": models}
    report.save("step_speed", summary, markdown(summary))


if __name__ == "__main__":
    main()
