"""Step time of one small LM unpipelined, as a GPipe pipeline and as a circular one, on 8 fake
CPU devices, next to what the bubble formula predicts.

The same 8-layer model (d 128, sequence 64, global batch 64, float32, SAVE_NOTHING remat, Adam)
is trained with a plain ``jit(value_and_grad + optax)`` step: unpipelined (scanned layers,
replica 8) and pipelined over 4 stages x replica 2, GPipe and circular (2 repeats), at 4, 8 and
16 microbatches. (Replica, not data: ``data`` shards the weights FSDP-style, and a pipeline
gathers them again for every microbatch, a cost per iteration that the bubble formula does not
describe.) Configurations are timed in interleaved rounds (median of the rounds' medians).

On fake devices the 8 devices share this host's cores, so a bubble is not idle time but work
done on zeros: a pipeline runs ``M x R + S - 1`` iterations for ``M x R`` iterations of useful
work, and the formula predicts a step ``(M x R + S - 1) / (M x R)`` = ``1 / (1 - bubble)`` times
the useful work's. The ``rest`` column (measured / unpipelined / predicted) is what the bubble
does not explain: the per-iteration rematerialisation (one more forward pass) and the
schedule's own costs; it should stay about constant across microbatch counts.

    python bench/pipeline_speed.py [--rounds 3] [--steps 5]

Writes bench/results/pipeline_speed.{json,md}.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import report
from jax.sharding import Mesh, NamedSharding

from pax_core import axes
from pax_pipeline import Pipeline
from pax_transformer import TransformerLm

MODEL = dict(vocab_size=256, num_layers=8, model_dims=128, hidden_dims=512, num_heads=4,
             max_seq_len=64, position="rotary", remat_policy="SAVE_NOTHING")
BATCH, LENGTH, STAGES = 64, 64, 4


def configurations() -> dict[str, tuple[TransformerLm, tuple[int, ...], tuple, Pipeline | None]]:
    out = {"unpipelined (replica 8)": (TransformerLm(**MODEL, scan_layers=True), (1, 8, 1, 1),
                                       axes.DEFAULT_RULES, None)}
    for repeat in (1, 2):
        for micro in (4, 8, 16):
            pipeline = Pipeline(num_stages=STAGES, num_microbatches=micro,
                                circular_repeat=repeat)
            name = f"{pipeline.kind} S={STAGES} M={micro}" + (f" R={repeat}" if repeat > 1
                                                                 else "")
            out[name] = (TransformerLm(**MODEL, stack=pipeline), (STAGES, 2, 1, 1),
                         axes.PIPELINE_RULES, pipeline)
    return out


def lm_loss(model: TransformerLm, params: dict, ids: jax.Array) -> jax.Array:
    """Next-token cross-entropy of ``ids`` ``[batch, length + 1]``."""
    logits = model.apply({"params": params}, ids[:, :-1], train=True)
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], -1))


def compiled_step(model: TransformerLm, shape: tuple[int, ...], rules: tuple):
    """A jitted Adam step over the mesh, its sharded initial state and a batch."""
    mesh = Mesh(np.array(jax.devices()).reshape(shape), axes.PIPELINE_MESH)
    ids = jax.random.randint(jax.random.PRNGKey(0), (BATCH, LENGTH + 1), 0, 256)
    tx = optax.adam(1e-3)
    loss = functools.partial(lm_loss, model)

    def step(params, opt_state, ids):
        value, grads = jax.value_and_grad(loss)(params, ids)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, value

    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), ids[:, :-1])["params"]
        shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(boxed), mesh, rules)
        params = jax.jit(lambda: nn.meta.unbox(model.init(jax.random.PRNGKey(0), ids[:, :-1])
                                               ["params"]), out_shardings=shardings)()
        ids = jax.device_put(ids, NamedSharding(mesh, nn.logical_to_mesh_axes(
            (axes.BATCH, None), rules)))
        jitted = jax.jit(step, donate_argnums=(0, 1))
        opt_state = tx.init(params)

        def run(state, steps):
            params, opt_state = state
            for _ in range(steps):
                params, opt_state, value = jitted(params, opt_state, ids)
            value.block_until_ready()
            return params, opt_state

        state = run((params, opt_state), 2)  # compile and warm up
    return run, state, mesh, rules


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    configs = configurations()
    prepared = {name: compiled_step(*config[:3]) for name, config in configs.items()}
    times: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, (run, state, mesh, rules) in prepared.items():
            with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
                per_step = []
                for _ in range(args.steps):
                    start = time.perf_counter()
                    state = run(state, 1)
                    per_step.append(time.perf_counter() - start)
            prepared[name] = (run, state, mesh, rules)
            times[name].append(statistics.median(per_step))
    base = statistics.median(times["unpipelined (replica 8)"])
    rows = []
    for name, (_, shape, _, pipeline) in configs.items():
        t = statistics.median(times[name])
        row = {"configuration": name, "mesh": dict(zip(axes.PIPELINE_MESH, shape, strict=True)),
               "step_ms": 1000 * t, "ratio": t / base}
        if pipeline is not None:
            micro = pipeline.microbatches(BATCH)
            row.update(schedule=pipeline.kind, stages=pipeline.num_stages, microbatches=micro,
                       circular_repeat=pipeline.circular_repeat)
            row["bubble"] = pipeline.bubble(micro)
            row["predicted_ratio"] = 1 / (1 - row["bubble"])
            row["rest"] = row["ratio"] / row["predicted_ratio"]
        rows.append(row)
    lines = ["| configuration | step (ms) | / unpipelined | bubble | predicted by the bubble | "
             "rest |", "|---|---|---|---|---|---|"]
    for r in rows:
        extra = (f"{r['bubble']:.3f} | {r['predicted_ratio']:.2f} | {r['rest']:.2f}"
                 if "bubble" in r else "- | - | -")
        lines.append(f"| {r['configuration']} | {r['step_ms']:.0f} | {r['ratio']:.2f} | "
                     f"{extra} |")
    report.save("pipeline_speed", {"model": MODEL, "batch": BATCH, "length": LENGTH,
                                     "devices": 8, "host_cores": os.cpu_count(),
                                     "rounds": args.rounds, "steps": args.steps, "rows": rows},
                "\n".join(lines))


if __name__ == "__main__":
    main()
