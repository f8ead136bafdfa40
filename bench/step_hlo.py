"""Pax's compiled train step against a bare one: the same matrix products, and what XLA's cost
analysis counts for each (FLOPs, transcendentals, bytes accessed).

For each model, in one process on one CPU device (float32), two programs are compiled for the
same parameter, optimizer-state and batch shapes:

* pax: ``Run.compile_train_step``, what ``pax train`` runs (the loss's metrics, the gradient
  norm and the anomaly check beside the update);
* bare: ``bare_loop.bare_step``, the model's loss, ``value_and_grad`` and one optax update.

Their optimised HLO is compared instruction by instruction: every matrix product (``dot``,
``convolution``) as its operand and result shapes and dimension numbers, as a multiset (the
two programs do the same model math when these are equal), then the count of every other
opcode. With ``--time N`` both programs then run N times each, one after the other in turn, on
the training input's first batch from the initial state: the step's own time, with neither
loop around it (``train_speed.py`` times the loops, a process each).

    python bench/step_hlo.py [--models quickstart,llama25m,llama25m-plain,lm50m] [--time N]

Writes bench/results/step_hlo.{json,md}.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import re
import statistics
import time
from typing import Any

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["PAX_COMPILATION_CACHE"] = "off"  # every program compiled here, none read back
os.environ.pop("XLA_FLAGS", None)

import jax
import report
from bare_loop import bare_step
from train_speed import MODELS

from pax_core.config.resolve import resolve
from pax_core.plugins.host import PluginHost
from pax_core.run.build import build_run
from pax_core.speed.flops import hardware_flops, model_flops

# An instruction of an array shape: ``%name = f32[8,128]{1,0} opcode(%a, %b), attributes``.
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?(?P<name>[\w.\-]+) = "
                          r"(?P<shape>[a-z0-9]+\[[\d,]*\])(?:\{[^}]*\})? "
                          r"(?P<op>[a-z][\w\-]*)\((?P<args>[^)]*)\)(?P<attrs>.*)$")
# The opcode of any instruction, tuple-shaped ones included.
_ANY_OPCODE = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = .*?(?:^|[\s}\]])([a-z][\w\-]*)\((?=%|\))")
_DIMENSIONS = re.compile(r"((?:lhs|rhs)_(?:batch|contracting)_dims=\{[\d,]*\}|dim_labels=\S+"
                         r"|window=\{[^}]*\})")
MATMULS = ("dot", "convolution")
COSTS = ("flops", "transcendentals", "bytes accessed")


def parse(hlo: str) -> tuple[collections.Counter, collections.Counter]:
    """The matrix products (operand shapes, result shape, dimension numbers) and the count of
    each opcode, over every computation of an optimised HLO module (fusions' bodies
    included; instruction names are unique within a module)."""
    shapes, products, opcodes = {}, [], collections.Counter()
    for line in hlo.splitlines():
        found = _ANY_OPCODE.match(line)
        if found:
            opcodes[found.group(1)] += 1
        match = _INSTRUCTION.match(line)
        if match:
            shapes[match["name"]] = match["shape"]
            if match["op"] in MATMULS:
                products.append(match)
    matmuls = collections.Counter(
        (m["op"], tuple(shapes.get(a.strip().lstrip("%"), "?") for a in m["args"].split(",")),
         m["shape"], tuple(_DIMENSIONS.findall(m["attrs"])))
        for m in products)
    return matmuls, opcodes


def _costs(compiled: Any) -> dict[str, float]:
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):  # older jax: one dict per program
        analysis = analysis[0]
    return {key: float(analysis[key]) for key in COSTS}


def programs(exp: str) -> tuple[dict[str, Any], Any, dict[str, float]]:
    """Pax's and the bare step compiled for the experiment's shapes, the run, and the seconds
    each took to compile."""
    host = PluginHost()
    run = build_run(host, resolve(host, exp, None, []), jax.devices()[:1])
    state = run.abstract_state
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in run.batch_spec.items()}
    seconds = {}
    started = time.perf_counter()
    pax = run.compile_train_step(donate_state=False)
    seconds["pax"] = time.perf_counter() - started
    started = time.perf_counter()
    bare = jax.jit(bare_step(run.task.model, run.tx)).lower(
        state.params, state.opt_state, batch, state.rng).compile()
    seconds["bare"] = time.perf_counter() - started
    return {"pax": pax, "bare": bare}, run, seconds


def step_seconds(compiled: dict[str, Any], run: Any, repeats: int) -> dict[str, float]:
    """Median seconds of a step of each program, run in turn on the same state and batch."""
    state = run.init_state()
    batch = run.partitioner.global_batch(run.train_input.get_next())
    calls = {"pax": lambda: compiled["pax"](state, batch),
             "bare": lambda: compiled["bare"](state.params, state.opt_state, batch, state.rng)}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for name in calls:  # a first run of each, untimed
        jax.block_until_ready(calls[name]())
    for _ in range(repeats):
        for name, call in calls.items():
            started = time.perf_counter()
            jax.block_until_ready(call())
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(t) for name, t in times.items()}


def compare(name: str, repeats: int = 0) -> dict[str, Any]:
    compiled, run, seconds = programs(MODELS[name].exp)
    parsed = {p: parse(c.as_text()) for p, c in compiled.items()}
    (pax_mm, pax_ops), (bare_mm, bare_ops) = parsed["pax"], parsed["bare"]
    costs = {p: _costs(c) for p, c in compiled.items()}
    formula_flops, formula = model_flops(run.task.model, run.batch_spec)
    tokens = math.prod(run.batch_spec["ids"].shape)
    differing = {op: {"pax": pax_ops[op], "bare": bare_ops[op]}
                 for op in sorted(set(pax_ops) | set(bare_ops)) if pax_ops[op] != bare_ops[op]}
    result = {
        "model": MODELS[name].name,
        "experiment": MODELS[name].exp,
        "tokens_per_step": tokens,
        "matmuls": {"pax": sum(pax_mm.values()), "bare": sum(bare_mm.values()),
                    "same": pax_mm == bare_mm,
                    "only_pax": [repr(k) for k in (pax_mm - bare_mm)],
                    "only_bare": [repr(k) for k in (bare_mm - pax_mm)]},
        "instructions": {"pax": sum(pax_ops.values()), "bare": sum(bare_ops.values())},
        "opcodes_differing": differing,
        "costs": costs,
        "cost_ratio": {k: costs["pax"][k] / costs["bare"][k] for k in COSTS},
        "model_flops": formula_flops,
        "flops_formula": formula,
        "hardware_flops": hardware_flops(compiled["pax"], 1),
        "compile_sec": seconds,
    }
    if repeats:
        result["step_sec"] = step_seconds(compiled, run, repeats)
        result["step_repeats"] = repeats
    print(f"  {result['model']}: {result['matmuls']['pax']} matrix products in Pax's step, "
          f"{result['matmuls']['bare']} in the bare one, the same: "
          f"{result['matmuls']['same']}", flush=True)
    return result


def markdown(models: list[dict]) -> str:
    lines = ["# Pax's train step against a bare step, compiled (one CPU device, float32)", "",
             "| model | matrix products pax | bare | the same | instructions pax | bare | "
             "FLOPs pax (XLA) | bare | pax/bare | transcendentals pax/bare | bytes accessed "
             "pax | bare | pax/bare | model FLOPs (formula) | XLA / formula |",
             "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: | ---: | ---: |"]
    for m in models:
        c, r = m["costs"], m["cost_ratio"]
        formula = (f"{m['model_flops']:.4g} ({m['flops_formula']}) | "
                   f"{m['hardware_flops'] / m['model_flops']:.3f}" if m["model_flops"]
                   else "- | -")
        lines.append(
            f"| {m['model']} | {m['matmuls']['pax']} | {m['matmuls']['bare']} | "
            f"{'yes' if m['matmuls']['same'] else 'NO'} | {m['instructions']['pax']:,} | "
            f"{m['instructions']['bare']:,} | {c['pax']['flops']:.6g} | "
            f"{c['bare']['flops']:.6g} | {r['flops']:.5f} | {r['transcendentals']:.5f} | "
            f"{c['pax']['bytes accessed']:.6g} | {c['bare']['bytes accessed']:.6g} | "
            f"{r['bytes accessed']:.5f} | {formula} |")
    timed = [m for m in models if "step_sec" in m]
    if timed:
        lines += ["", "| model | a step, pax (s) | bare (s) | bare / pax (speed) | runs each |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        lines += [f"| {m['model']} | {m['step_sec']['pax']:.3f} | {m['step_sec']['bare']:.3f} | "
                  f"{m['step_sec']['bare'] / m['step_sec']['pax']:.3f} | {m['step_repeats']} |"
                  for m in timed]
    lines += ["", "Opcodes whose counts differ (pax / bare):", ""]
    for m in models:
        differing = ", ".join(f"{op} {n['pax']}/{n['bare']}"
                              for op, n in m["opcodes_differing"].items())
        lines.append(f"* {m['model']}: {differing or 'none'}")
    lines += ["", "\"The same\": every matrix product's operand and result shapes and dimension "
              "numbers, as a multiset. What Pax's step adds is elementwise and reduction work "
              "(the loss's metrics, the gradient norm, the anomaly check); XLA's FLOPs count "
              "the compiled program (scanned layers once: \"XLA / formula\" uses the count "
              "corrected for loops)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="quickstart")
    parser.add_argument("--time", type=int, default=0, metavar="N",
                        help="also run each program N times, in turn, and time its step")
    args = parser.parse_args()
    models = [compare(name, args.time) for name in args.models.split(",")]
    report.save("step_hlo", {"models": models}, markdown(models))


if __name__ == "__main__":
    main()
