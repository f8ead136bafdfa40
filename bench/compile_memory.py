"""Compiling Pax's train step: where its time goes (tracing, lowering, XLA's compilation, or
the persistent cache's read), what XLA's memory analysis says the step needs, the process's
resident memory across it, and what giving the compiler's freed heap back (glibc's
``malloc_trim``, which ``pax train`` calls before its first step) saves.

Each measurement is a fresh process doing what ``pax train`` does, in its order, with Pax's own
functions: build the run, compile the train step (``Run.compile_train_step``, timed phase by
phase by JAX's monitoring events), initialise the state, give the freed heap back
(``release_freed_memory``) or not, and train ``--steps`` steps. Resident memory is read from
``/proc/self/status`` at each stage; the peak of the training steps alone is measured by
resetting the kernel's high-water mark (``/proc/self/clear_refs``) before the first step. Each
round runs three processes, in turn: cold with the give-back, cold without (each with an empty
compilation cache), and warm (the first one's cache filled). Medians over
the rounds; on a shared machine, read the ratios.

    python bench/compile_memory.py [--models quickstart,llama25m,lm50m] [--rounds 3]

Writes bench/results/compile_memory.{json,md}. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import report
from train_speed import MODELS

MIB = 2**20
# JAX's monitoring events while a program is prepared (jax._src.dispatch and compiler).
PHASES = {"trace": "/jax/core/compile/jaxpr_trace_duration",
          "lower": "/jax/core/compile/jaxpr_to_mlir_module_duration",
          "compile": "/jax/core/compile/backend_compile_duration",
          "cache_read": "/jax/compilation_cache/cache_retrieval_time_sec"}
STAGES = ("imported", "run_built", "compiled", "state_ready", "given_back", "first_step",
          "trained")
MEMORY = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
          "temp_size_in_bytes", "generated_code_size_in_bytes")


def _status() -> dict[str, float]:
    """This process's resident memory now and its high-water mark, in MiB."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024 / MIB
    return found


def child(exp: str, give_back: bool, steps: int) -> dict[str, Any]:
    """One measurement, in this (fresh) process; ``PAX_COMPILATION_CACHE`` says the cache."""
    import jax

    from pax_core.config.resolve import resolve
    from pax_core.plugins.host import PluginHost
    from pax_core.run.build import build_run
    from pax_core.run.compilation_cache import use_compilation_cache
    from pax_core.run.host_memory import release_freed_memory

    rss = {"imported": _status()["VmRSS"]}
    use_compilation_cache()
    host = PluginHost()
    run = build_run(host, resolve(host, exp, None, []), jax.devices()[:1])
    rss["run_built"] = _status()["VmRSS"]
    events: dict[str, float] = collections.defaultdict(float)

    def listen(event: str, seconds: float, **_: Any) -> None:
        events[event] += seconds

    jax.monitoring.register_event_duration_secs_listener(listen)
    started = time.perf_counter()
    compiled = run.compile_train_step()
    total = time.perf_counter() - started
    jax.monitoring.unregister_event_duration_listener(listen)
    now = _status()
    rss["compiled"], compile_peak = now["VmRSS"], now["VmHWM"]
    memory = compiled.memory_analysis()
    state = jax.block_until_ready(run.init_state())
    rss["state_ready"] = _status()["VmRSS"]
    trimmed = release_freed_memory() if give_back else False
    rss["given_back"] = _status()["VmRSS"]
    before_training = _status()["VmHWM"]
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again here
    for step in range(steps):
        state, metrics = compiled(state, run.partitioner.global_batch(
            run.train_input.get_next()))
        if step == 0:
            jax.block_until_ready((state, metrics))
            rss["first_step"] = _status()["VmRSS"]
    jax.block_until_ready((state, metrics))
    now = _status()
    rss["trained"] = now["VmRSS"]
    return {
        "phases_sec": {name: events.get(event, 0.0) for name, event in PHASES.items()},
        "compile_train_step_sec": total,
        "memory_analysis_mib": {k.removesuffix("_in_bytes"): getattr(memory, k) / MIB
                                for k in MEMORY},
        "rss_mib": rss,
        "compile_peak_mib": compile_peak,
        "training_peak_mib": now["VmHWM"],
        "process_peak_mib": max(before_training, now["VmHWM"]),
        "malloc_trim_called": trimmed,
    }


def _measure(exp: str, cache: str, give_back: bool, steps: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", PAX_COMPILATION_CACHE=cache)
    argv = [sys.executable, __file__, "--child", exp, "--steps", str(steps)]
    if give_back:
        argv.append("--give-back")
    done = subprocess.run(argv, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _median(runs: list[dict], *path: str) -> float:
    def get(run: dict) -> float:
        for key in path:
            run = run[key]
        return run

    return statistics.median(get(r) for r in runs)


def bench_model(name: str, rounds: int, steps: int) -> dict[str, Any]:
    model = MODELS[name]
    runs: dict[str, list[dict]] = {"cold": [], "cold_no_give_back": [], "warm": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            first, second = Path(tmp) / f"cache-{r}", Path(tmp) / f"cache-{r}-b"
            runs["cold"].append(_measure(model.exp, str(first), True, steps))
            runs["cold_no_give_back"].append(_measure(model.exp, str(second), False, steps))
            runs["warm"].append(_measure(model.exp, str(first), True, steps))
            cold, kept, warm = (runs[k][-1] for k in runs)
            print(f"  {model.name} round {r + 1}: compile_train_step cold "
                  f"{cold['compile_train_step_sec']:.2f} s, warm "
                  f"{warm['compile_train_step_sec']:.2f} s; training peak "
                  f"{cold['training_peak_mib']:,.0f} MiB given back, "
                  f"{kept['training_peak_mib']:,.0f} MiB kept", flush=True)
    summary = {kind: {
        "phases_sec": {p: _median(found, "phases_sec", p) for p in PHASES},
        "compile_train_step_sec": _median(found, "compile_train_step_sec"),
        "rss_mib": {s: _median(found, "rss_mib", s) for s in STAGES},
        **{key: _median(found, key) for key in ("compile_peak_mib", "training_peak_mib",
                                                 "process_peak_mib")},
    } for kind, found in runs.items()}
    trim, kept = summary["cold"], summary["cold_no_give_back"]
    return {
        "model": model.name,
        "experiment": model.exp.replace(str(Path(__file__).resolve().parent.parent) + "/", ""),
        "rounds": rounds,
        "steps": steps,
        "memory_analysis_mib": runs["cold"][0]["memory_analysis_mib"],
        "malloc_trim_available": runs["cold"][0]["malloc_trim_called"],
        **summary,
        "given_back_mib": trim["rss_mib"]["state_ready"] - trim["rss_mib"]["given_back"],
        "training_peak_ratio": kept["training_peak_mib"] / trim["training_peak_mib"],
        "process_peak_ratio": kept["process_peak_mib"] / trim["process_peak_mib"],
        "warm_compile_ratio": summary["warm"]["compile_train_step_sec"]
        / trim["compile_train_step_sec"],
        "samples": runs,
    }


def markdown(models: list[dict]) -> str:
    lines = ["# Compiling Pax's train step: time, memory, and the freed heap given back", "",
             "One CPU device, float32; fresh processes, medians of the rounds.", "",
             "| model | kind | trace (s) | lower (s) | XLA compile or cache (s) | of which "
             "cache read (s) | compile_train_step (s) | warm / cold |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for m in models:
        for kind in ("cold", "warm"):
            p = m[kind]["phases_sec"]
            ratio = f"{m['warm_compile_ratio']:.2f}" if kind == "warm" else ""
            lines.append(f"| {m['model']} | {kind} | {p['trace']:.2f} | {p['lower']:.2f} | "
                         f"{p['compile']:.2f} | {p['cache_read']:.2f} | "
                         f"{m[kind]['compile_train_step_sec']:.2f} | {ratio} |")
    lines += ["", "\"XLA compile or cache\" is the backend's part: it looks the program up in "
              "the persistent cache (the cache read) and compiles it on a miss; a warm run "
              "still traces and lowers, since the cache is keyed by the lowered program.", "",
              "XLA's memory analysis of the step (MiB):", "",
              "| model | arguments | outputs | aliased | temporaries | generated code |",
              "|---|---:|---:|---:|---:|---:|"]
    for m in models:
        a = m["memory_analysis_mib"]
        lines.append(f"| {m['model']} | {a['argument_size']:.1f} | {a['output_size']:.1f} | "
                     f"{a['alias_size']:.1f} | {a['temp_size']:.1f} | "
                     f"{a['generated_code_size']:.1f} |")
    lines += ["", "Resident memory (MiB) after each stage, cold; the give-back is "
              "`malloc_trim(0)` once the state is ready, before the first step, as in "
              "`pax train`:", "",
              "| model | freed heap | imports | run built | compiled (peak) | state ready | "
              "given back | first step | after training | training peak | process peak |",
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for m in models:
        for kind, label in (("cold", "given back"), ("cold_no_give_back", "kept")):
            s, r = m[kind], m[kind]["rss_mib"]
            lines.append(
                f"| {m['model']} | {label} | {r['imported']:,.0f} | {r['run_built']:,.0f} | "
                f"{r['compiled']:,.0f} ({s['compile_peak_mib']:,.0f}) | "
                f"{r['state_ready']:,.0f} | {r['given_back']:,.0f} | {r['first_step']:,.0f} | "
                f"{r['trained']:,.0f} | {s['training_peak_mib']:,.0f} | "
                f"{s['process_peak_mib']:,.0f} |")
    lines += [""]
    for m in models:
        lines.append(f"* {m['model']}: the give-back returned {m['given_back_mib']:,.0f} MiB; "
                     f"kept, the training peak is {m['training_peak_ratio']:.2f}x and the "
                     f"process's peak {m['process_peak_ratio']:.2f}x those with it "
                     f"({m['steps']} steps).")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="quickstart")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="steps trained (default 10)")
    parser.add_argument("--child", metavar="EXP", help=argparse.SUPPRESS)
    parser.add_argument("--give-back", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.give_back, args.steps)))
        return
    models = [bench_model(name, args.rounds, args.steps) for name in args.models.split(",")]
    report.save("compile_memory", {"models": models}, markdown(models))


if __name__ == "__main__":
    main()
