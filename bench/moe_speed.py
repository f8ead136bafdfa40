"""Mixture-of-Experts on CPU: Pax's ``MoeFeedForward`` against a hand-written flax MoE, and the
quick start as a MoE against the dense quick start, in float32.

1. Layer speed. ``HandMoe`` below is a dropless MoE feed-forward written the way a user writes
   it in flax linen, nothing imported from Pax: a float32 router, softmax, top-k, the chosen
   weights renormalised, the token-choices sorted by expert (``argsort``), gated-SiLU experts
   as ``jax.lax.ragged_dot`` grouped matmuls, the outputs unsorted (a gather by the inverse
   permutation) and combined. Pax's ``MoeFeedForward`` (dropless, gated SiLU) runs on the same
   shapes from the same weights; both are first checked to give the same output and the same
   gradients. Each program is one jitted forward and backward step (``value_and_grad`` of the
   mean square of the output, over the weights and the input), compiled before timing; the
   programs run interleaved, each round in a rotated order, and the median round is reported.
   Also timed, for reference only (it drops choices, so it is not the same math): Pax's
   capacity path (GShard, capacity factor 2.0). Each program's FLOPs as XLA counts them are
   set against the active FLOPs (6 per token-choice and expert weight), since on CPU
   ``ragged_dot`` has no grouped kernel: JAX lowers it to a masked dense product over every
   expert.
2. The quick start, MoE against dense: ``pax train`` of ``lm/QuickStartLm`` and
   ``lm/QuickStartMoeLm`` (600 steps each, in child processes, one after the other), with the
   held-out log-perplexity at each evaluation, the parameter counts ``pax plan`` gives (total
   and active a token) and the median steps/s of the run's summaries after the first. The
   two runs go one after the other, under different shares of a shared machine's load, so the
   step-time ratio is also measured within one process: both experiments' compiled ``pax
   train`` steps (and the MoE with a capacity factor of 2.0, for reference) timed interleaved.

    python bench/moe_speed.py [--rounds 7] [--steps 2] [--shapes e8,e16] [--skip-train]
        [--work DIR]

Writes bench/results/moe_speed.json and moe_speed.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.pop("XLA_FLAGS", None)

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import report

PAX = str(Path(sys.executable).with_name("pax"))
TARGET = 0.95  # Pax's tokens/s over the hand-written layer's
EXPERIMENTS = {"dense": "QuickStartLm", "moe": "QuickStartMoeLm"}


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    batch: int
    length: int
    dims: int
    experts: int
    top_k: int
    hidden: int

    @property
    def tokens(self) -> int:
        return self.batch * self.length

    def active_flops(self) -> float:
        """Forward and backward of the experts' matmuls for every token-choice: 6 FLOPs per
        weight it multiplies (three matrices of ``dims x hidden``), the router's too."""
        per_choice = 3 * self.dims * self.hidden
        return 6.0 * self.tokens * (self.top_k * per_choice + self.dims * self.experts)


SHAPES = {
    "e8": Shape("tokens [8, 512, 256], 8 experts top-2, hidden 512", 8, 512, 256, 8, 2, 512),
    "e16": Shape("tokens [8, 512, 256], 16 experts top-2, hidden 256", 8, 512, 256, 16, 2, 256),
}


class HandMoe(nn.Module):
    """A dropless MoE feed-forward as a user writes it: [B, L, d] -> [B, L, d]."""

    experts: int
    top_k: int
    hidden: int

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        b, length, d = x.shape
        init = nn.initializers.variance_scaling(1.0, "fan_in", "normal")
        logits = nn.Dense(self.experts, use_bias=False, kernel_init=init, name="router")(
            x.astype(jnp.float32))
        probs = jax.nn.softmax(logits, axis=-1)
        weights, chosen = jax.lax.top_k(probs, self.top_k)
        weights = weights / weights.sum(axis=-1, keepdims=True)

        def expert_init(key, shape):  # each expert's [in, out] on its own
            return jax.vmap(lambda k: init(k, shape[1:]))(jax.random.split(key, shape[0]))

        wi = self.param("wi", expert_init, (self.experts, d, self.hidden))
        wi_gate = self.param("wi_gate", expert_init, (self.experts, d, self.hidden))
        wo = self.param("wo", expert_init, (self.experts, self.hidden, d))

        tokens = x.reshape(-1, d)
        flat = chosen.reshape(-1)  # token by token, choice by choice
        order = jnp.argsort(flat)
        group_sizes = jnp.bincount(flat, length=self.experts)
        xs = tokens[order // self.top_k]
        h = nn.silu(jax.lax.ragged_dot(xs, wi_gate, group_sizes)) * jax.lax.ragged_dot(
            xs, wi, group_sizes)
        ys = jax.lax.ragged_dot(h, wo, group_sizes)
        ys = ys[jnp.argsort(order)].reshape(b, length, self.top_k, d)
        return jnp.sum(ys * weights[..., None].astype(ys.dtype), axis=2)


def pax_moe(shape: Shape, capacity_factor: float | None) -> nn.Module:
    from pax_transformer import MoeFeedForward

    return MoeFeedForward(num_experts=shape.experts, hidden_dims=shape.hidden,
                          kernel_init=nn.initializers.variance_scaling(1.0, "fan_in", "normal"),
                          top_k=shape.top_k, capacity_factor=capacity_factor,
                          activation="silu", gated=True)


def to_hand(pax_params: dict) -> dict:
    """Pax's MoE weights under the hand-written module's names."""
    return {"router": {"kernel": pax_params["router"]}, "wi": pax_params["wi"],
            "wi_gate": pax_params["wi_gate"], "wo": pax_params["wo"]}


def step_of(apply):
    """The jitted forward and backward step of ``apply(params, x) -> [B, L, d]``."""

    def loss(params, x):
        return jnp.mean(jnp.square(apply(params, x)))

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def programs(shape: Shape) -> tuple[dict, jax.Array, dict]:
    """Each program as (compiled step, its weights); the input; the same-math check."""
    x = jax.random.normal(jax.random.key(1), (shape.batch, shape.length, shape.dims))
    pax, capacity = pax_moe(shape, None), pax_moe(shape, 2.0)
    pax_params = nn.meta.unbox(jax.jit(pax.init)(jax.random.key(0), x)["params"])
    hand = HandMoe(shape.experts, shape.top_k, shape.hidden)
    hand_params = to_hand(pax_params)
    steps = {
        "hand": (step_of(lambda p, x: hand.apply({"params": p}, x)), hand_params),
        "pax": (step_of(lambda p, x: pax.apply({"params": p}, x)[0]), pax_params),
        "pax-capacity-2.0": (step_of(lambda p, x: capacity.apply({"params": p}, x)[0]),
                             pax_params),
    }
    out_hand = jax.jit(hand.apply)({"params": hand_params}, x)
    out_pax = jax.jit(pax.apply)({"params": pax_params}, x)[0]
    np.testing.assert_allclose(out_pax, out_hand, rtol=1e-5, atol=1e-5)
    (_, (g_hand, gx_hand)) = steps["hand"][0](hand_params, x)
    (_, (g_pax, gx_pax)) = steps["pax"][0](pax_params, x)
    pairs = list(zip([*jax.tree.leaves(to_hand(g_pax)), gx_pax],
                     [*jax.tree.leaves(g_hand), gx_hand], strict=True))
    for a, b in pairs:
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    checked = {"max_abs_output_difference": float(jnp.max(jnp.abs(out_pax - out_hand))),
               "max_abs_gradient_difference": max(float(jnp.max(jnp.abs(a - b)))
                                                  for a, b in pairs)}
    compiled = {name: (fn.lower(params, x).compile(), params)
                for name, (fn, params) in steps.items()}
    return compiled, x, checked


def hlo_ops(compiled) -> dict:
    """How many sorts, scatters, gathers and matmuls the optimised step holds, and its
    temporaries in MiB: where two steps of the same math differ."""
    text = compiled.as_text()
    found = {op: len(re.findall(rf" {op}\(", text)) for op in ("sort", "scatter", "gather", "dot")}
    return {**found, "temp_mib": compiled.memory_analysis().temp_size_in_bytes / 2**20}


def _flops(compiled) -> float | None:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"]) if cost and "flops" in cost else None


def timed(compiled, params, x, steps: int) -> float:
    """Seconds per step over ``steps`` steps."""
    started = time.perf_counter()
    for _ in range(steps):
        out = compiled(params, x)
    jax.block_until_ready(out)
    return (time.perf_counter() - started) / steps


def bench_layer(key: str, rounds: int, steps: int) -> dict:
    shape = SHAPES[key]
    compiled, x, checked = programs(shape)
    print(f"  {shape.name}: same output (max difference "
          f"{checked['max_abs_output_difference']:.2e}) and gradients "
          f"({checked['max_abs_gradient_difference']:.2e})", flush=True)
    for fn, params in compiled.values():  # the first execution's one-off costs
        timed(fn, params, x, 1)
    names = list(compiled)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(timed(*compiled[name], x, steps))
    step_sec = {name: statistics.median(t) for name, t in samples.items()}
    # The ratio within each round, then its median: rounds share the machine's mood.
    ratio = statistics.median(h / p for h, p in zip(samples["hand"], samples["pax"],
                                                    strict=True))
    result = {
        "shape": dataclasses.asdict(shape), "rounds": rounds, "steps_per_sample": steps,
        "same_math": checked,
        "step_sec": step_sec,
        "tokens_per_sec": {name: shape.tokens / t for name, t in step_sec.items()},
        "pax_over_hand": ratio,
        "active_flops_per_step": shape.active_flops(),
        "xla_flops_per_step": {name: _flops(fn) for name, (fn, _) in compiled.items()},
        "hlo_ops": {name: hlo_ops(fn) for name, (fn, _) in compiled.items()},
        "samples": samples,
    }
    print(f"  {shape.name}: " + ", ".join(f"{n} {1e3 * t:,.0f} ms" for n, t in step_sec.items())
          + f"; pax/hand {ratio:.3f}", flush=True)
    return result


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return {**env, "JAX_PLATFORMS": "cpu"}


def plan(exp: str) -> dict:
    done = subprocess.run([PAX, "plan", "--plugin", "lm", "--exp", exp, "--json"],
                          capture_output=True, text=True, env=_environment())
    if done.returncode != 0:
        raise SystemExit(f"pax plan --exp {exp} failed:\n{done.stderr[-3000:]}")
    found = json.loads(done.stdout)
    return {"params": found["params"], "active_params": found["active_params"]}


def train(exp: str, job_dir: Path) -> dict:
    """``pax train`` from a fresh job directory; what its records say."""
    log = job_dir.with_suffix(".log")
    started = time.perf_counter()
    with open(log, "w") as out:
        done = subprocess.run([PAX, "train", "--plugin", "lm", "--exp", exp,
                               "--job-dir", str(job_dir)], stdout=out,
                              stderr=subprocess.STDOUT, env=_environment())
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"pax train --exp {exp} failed:\n{log.read_text()[-3000:]}")
    records = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    train_records = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"].startswith("eval") and "log_pplx" in r]
    # After the first summary, whose interval holds the compilation.
    speeds = [r["steps_per_sec"] for r in train_records[1:]]
    return {
        "experiment": f"lm/{exp}",
        "steps": train_records[-1]["step"],
        "eval_log_pplx": {str(r["step"]): r["log_pplx"] for r in evals},
        "eval_kind": sorted({r["kind"] for r in evals}),
        "train_loss": {str(r["step"]): r["loss"] for r in train_records},
        "steps_per_sec": statistics.median(speeds),
        "steps_per_sec_samples": speeds,
        "first_step_sec": train_records[0].get("first_step_sec"),
        "wall_sec": wall,
    }


def quickstart_steps(rounds: int) -> dict:
    """The compiled train steps of ``pax train`` for each quick start (and, for reference, the
    MoE with a capacity factor of 2.0), timed interleaved in this process: the step-time ratio
    from one stretch of the machine's load, which the two runs one after the other are not."""
    from pax_core.config.resolve import resolve
    from pax_core.plugins.host import PluginHost
    from pax_core.run.build import build_run

    host, found, batches = PluginHost(), {}, {}
    variants = {"dense": (EXPERIMENTS["dense"], []), "moe": (EXPERIMENTS["moe"], []),
                "moe-capacity-2.0": (EXPERIMENTS["moe"], ["EXPERT_CAPACITY_FACTOR=2.0"])}
    for name, (exp, overrides) in variants.items():
        run = build_run(host, resolve(host, f"lm/{exp}", None, overrides), jax.devices()[:1])
        batches[name] = [run.partitioner.global_batch(run.train_input.get_next())
                         for _ in range(2)]
        found[name] = (run.compile_train_step(donate_state=False), run.init_state())

    def two_steps(name: str) -> float:
        compiled, state = found[name]
        started = time.perf_counter()
        for batch in batches[name]:
            state, metrics = compiled(state, batch)
        jax.block_until_ready(metrics)
        return (time.perf_counter() - started) / 2

    names = list(found)
    for name in names:  # the first execution's one-off costs
        two_steps(name)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(two_steps(name))
    step_sec = {name: statistics.median(t) for name, t in samples.items()}
    ratio = {name: statistics.median(t / d for t, d in zip(samples[name], samples["dense"],
                                                           strict=True))
             for name in names if name != "dense"}
    print("  quick-start steps: " + ", ".join(f"{n} {1e3 * t:,.0f} ms"
                                              for n, t in step_sec.items()), flush=True)
    return {"rounds": rounds, "step_sec": step_sec, "over_dense": ratio, "samples": samples}


def bench_train(work: Path) -> dict:
    found = {}
    for kind, exp in EXPERIMENTS.items():
        job_dir = work / kind
        if job_dir.exists():
            raise SystemExit(f"{job_dir} exists; give --work a directory without it")
        result = {**plan(exp), **train(exp, job_dir)}
        found[kind] = result
        print(f"  {exp}: held-out log_pplx {result['eval_log_pplx']}, "
              f"{result['steps_per_sec']:.2f} steps/s, {result['wall_sec']:.0f} s", flush=True)
    found["moe_over_dense_step_time"] = (found["dense"]["steps_per_sec"]
                                         / found["moe"]["steps_per_sec"])
    return found


def markdown(summary: dict) -> str:
    lines = ["# Mixture-of-Experts on CPU", "",
             f"{summary['machine']}; one CPU device, float32.", "",
             "## The layer: Pax's `MoeFeedForward` against a hand-written flax MoE", "",
             "Dropless, gated SiLU; one jitted forward + backward step (compile excluded), "
             "median over interleaved rounds; the same output and gradients from the same "
             "weights checked first. pax/hand is the median of the rounds' ratios. "
             "pax-capacity-2.0 drops choices (not the same math): for reference.", "",
             "| shape | hand tokens/s | pax tokens/s | pax/hand | pax-capacity-2.0 tokens/s | "
             "active GFLOP/step | XLA GFLOP/step hand | pax | capacity |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m in summary["layers"]:
        t, f = m["tokens_per_sec"], m["xla_flops_per_step"]
        gf = {k: "n/a" if v is None else f"{v / 1e9:,.1f}" for k, v in f.items()}
        lines.append(
            f"| {m['shape']['name']} | {t['hand']:,.0f} | {t['pax']:,.0f} | "
            f"{m['pax_over_hand']:.3f} | {t['pax-capacity-2.0']:,.0f} | "
            f"{m['active_flops_per_step'] / 1e9:,.1f} | {gf['hand']} | {gf['pax']} | "
            f"{gf['pax-capacity-2.0']} |")
    lines += ["", f"Target: pax/hand >= {TARGET}. On CPU `jax.lax.ragged_dot` is lowered to a "
              "masked dense product over every expert, so a dropless step costs about "
              "experts / top-k times its active FLOPs, Pax's and the hand-written alike.", "",
              "What each optimised step holds (XLA's HLO after optimisation):", "",
              "| shape | program | sorts | scatters | gathers | dots | temporaries (MiB) |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for m in summary["layers"]:
        for name, ops in m["hlo_ops"].items():
            lines.append(f"| {m['shape']['name']} | {name} | {ops['sort']} | {ops['scatter']} | "
                         f"{ops['gather']} | {ops['dot']} | {ops['temp_mib']:,.0f} |")
    if "train" in summary:
        tr = summary["train"]
        steps = sorted({s for k in EXPERIMENTS for s in tr[k]["eval_log_pplx"]}, key=int)
        lines += ["", "## The quick start: MoE against dense", "",
                  "`pax train` of each, 600 steps, one after the other; held-out log_pplx at "
                  "each evaluation; parameters from `pax plan`; steps/s the median of the "
                  "run's summaries after the first (eval time excluded).", "",
                  "| experiment | params | active params | "
                  + " | ".join(f"log_pplx @ {s}" for s in steps)
                  + " | steps/s | whole run (s) |",
                  "| --- | ---: | ---: | " + " | ".join("---:" for _ in steps) + " | ---: | ---: |"]
        for kind in EXPERIMENTS:
            r = tr[kind]
            cells = [f"{r['eval_log_pplx'][s]:.4f}" if s in r["eval_log_pplx"] else "-"
                     for s in steps]
            lines.append(f"| {r['experiment']} | {r['params']:,} | {r['active_params']:,} | "
                         + " | ".join(cells)
                         + f" | {r['steps_per_sec']:.2f} | {r['wall_sec']:.0f} |")
        last = steps[-1]
        gap = tr["moe"]["eval_log_pplx"][last] - tr["dense"]["eval_log_pplx"][last]
        lines += ["", f"Step time MoE / dense: {tr['moe_over_dense_step_time']:.2f}. Final "
                  f"held-out log_pplx MoE - dense: {gap:+.4f} "
                  f"({'MoE lower' if gap < 0 else 'MoE not lower'}). The two runs went one "
                  "after the other, each under its own share of a shared machine's load."]
    if "quickstart_steps" in summary:
        q = summary["quickstart_steps"]
        lines += ["", "The same quick starts' compiled `pax train` steps timed interleaved in "
                  f"one process ({q['rounds']} rounds of two steps, medians; the capacity "
                  "variant, which drops choices, for reference):", "",
                  "| program | step (ms) | over dense |", "| --- | ---: | ---: |"]
        for name, sec in q["step_sec"].items():
            over = f"{q['over_dense'][name]:.2f}" if name in q["over_dense"] else "1"
            lines.append(f"| {name} | {1e3 * sec:,.0f} | {over} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds of the layer timing")
    parser.add_argument("--steps", type=int, default=2, help="steps per timed sample")
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--skip-train", action="store_true", help="the layer timing only")
    parser.add_argument("--work", help="where the training runs go (default: a temporary "
                                       "directory, removed at the end)")
    args = parser.parse_args()
    started = time.perf_counter()
    summary: dict = {"machine": f"{platform.processor() or platform.machine()}, "
                                f"{os.cpu_count()} cores",
                     "layers": [bench_layer(key, args.rounds, args.steps)
                                for key in args.shapes.split(",")]}
    if not args.skip_train:
        if args.work:
            Path(args.work).mkdir(parents=True, exist_ok=True)
            summary["train"] = bench_train(Path(args.work))
        else:
            with tempfile.TemporaryDirectory() as tmp:
                summary["train"] = bench_train(Path(tmp))
        summary["quickstart_steps"] = quickstart_steps(args.rounds)
    summary["wall_sec"] = time.perf_counter() - started
    folder = report.save("moe_speed", summary, markdown(summary))
    print(f"({summary['wall_sec']:.0f} s; written to {folder})")


if __name__ == "__main__":
    main()
