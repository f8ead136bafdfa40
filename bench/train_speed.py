"""Training speed of `pax train` next to a bare jit + optax loop, on CPU in float32.

For the quick-start LM and a ~50M-parameter LM, both run the same model, batches and optimizer
in separate processes, interleaved (bare, pax, then pax, bare, ...), on one CPU device, and are
timed alike: wall-clock between summaries, after a warm-up. Reported:
XLA's matmul peak here (float32, bfloat16), tokens/s of each and their ratio, MFU against the
float32 peak, first-step time (compile included) and peak resident memory.
Targets: tokens/s ratio >= 0.98, first-step ratio <= 1.1.

    python bench/train_speed.py [--rounds N] [--models quickstart,lm50m]

Writes bench/results/train_speed.json and train_speed.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import report

HERE = Path(__file__).resolve().parent
PAX = str(Path(sys.executable).with_name("pax"))
TARGET_SPEED, TARGET_FIRST_STEP = 0.98, 1.1


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    exp: str
    steps: int
    warmup: int  # also the summary interval: tokens/s is timed from this summary to the last
    rounds: int

    def overrides(self) -> list[str]:
        never = self.steps + 1
        return [f"NUM_TRAIN_STEPS={self.steps}", f"SUMMARY_INTERVAL_STEPS={self.warmup}",
                f"EVAL_INTERVAL_STEPS={never}", f"CHECKPOINT_EVERY_N_STEPS={never}"]


MODELS = {
    "quickstart": Model("quick-start LM (1.8M)", "lm/QuickStartLm", steps=30, warmup=10,
                        rounds=4),
    "lm50m": Model("LM 50M", f"{HERE / 'models.py'}:BenchLm50M", steps=12, warmup=4, rounds=4),
}


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _run(argv: list[str], log: Path) -> tuple[str, float]:
    """Run a child; its stdout and its peak resident memory in MiB (from ``wait4``)."""
    with open(log, "w") as out:
        child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=_environment())
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    text = log.read_text()
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{text[-3000:]}")
    return text, usage.ru_maxrss / 1024


def run_bare(model: Model, workdir: Path) -> dict:
    argv = [sys.executable, str(HERE / "bare_loop.py"), "--exp", model.exp,
            "--steps", str(model.steps), "--warmup", str(model.warmup)]
    for item in model.overrides():
        argv += ["--set", item]
    out, rss = _run(argv, workdir / "bare.log")
    return {**json.loads(out.strip().splitlines()[-1]), "peak_rss_mib": rss}


def run_pax(model: Model, workdir: Path, index: int) -> dict:
    job_dir = workdir / f"pax-{index}"
    argv = [PAX, "train", "--exp", model.exp, "--job-dir", str(job_dir)]
    for item in model.overrides():
        argv += ["--set", item]
    _, rss = _run(argv, workdir / "pax.log")
    records = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["kind"] == "train"]
    tokens_per_step = train[-1]["num_predictions"]
    # Timed like the bare loop: between the wall-clock stamps of consecutive summaries.
    intervals = [(b["step"] - a["step"]) * tokens_per_step / (b["time"] - a["time"])
                 for a, b in itertools.pairwise(train) if a["step"] >= model.warmup]
    return {
        "interval_tokens_per_sec": intervals,
        "first_step_sec": train[0]["first_step_sec"],
        "losses": {str(r["step"]): r["loss"] for r in train},
        "mfu_logged": train[-1]["mfu"],
        "flops_per_token": next(r for r in records if r["kind"] == "start")
        ["model_flops_per_step"] / tokens_per_step,
        "peak_rss_mib": rss,
    }


def matmul_peaks() -> dict[str, float]:
    os.environ.pop("XLA_FLAGS", None)
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax.numpy as jnp

    from pax_core.speed.peak import matmul_flops_per_sec

    return {name: max(matmul_flops_per_sec(dtype, size) for size in (1024, 2048))
            for name, dtype in (("float32", jnp.float32), ("bfloat16", jnp.bfloat16))}


def bench_model(model: Model, rounds: int, peak_f32: float) -> dict:
    samples: dict[str, list[dict]] = {"bare": [], "pax": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            order = ("bare", "pax") if r % 2 == 0 else ("pax", "bare")
            for kind in order:
                started = time.perf_counter()
                result = (run_bare(model, Path(tmp)) if kind == "bare"
                          else run_pax(model, Path(tmp), r))
                result["wall_sec"] = time.perf_counter() - started
                samples[kind].append(result)
                rates = ", ".join(f"{x:,.0f}" for x in result["interval_tokens_per_sec"])
                print(f"  {model.name} round {r + 1} {kind}: tokens/s per interval {rates}; "
                      f"first step {result['first_step_sec']:.2f} s", flush=True)
    flops_per_token = samples["pax"][0]["flops_per_token"]
    summary = {}
    for kind, runs in samples.items():
        # The median interval over all rounds: one slow interval (a noisy neighbour) or one
        # lucky one moves it little.
        speed = statistics.median(x for s in runs for x in s["interval_tokens_per_sec"])
        summary[kind] = {
            "tokens_per_sec": speed,
            "mfu": speed * flops_per_token / peak_f32,
            "first_step_sec": statistics.median(s["first_step_sec"] for s in runs),
            "peak_rss_mib": max(s["peak_rss_mib"] for s in runs),
        }
    return {
        "model": model.name,
        "experiment": model.exp.replace(str(HERE.parent) + "/", ""),
        "rounds": rounds,
        "steps": model.steps,
        "timed_steps": model.steps - model.warmup,
        "flops_per_token": flops_per_token,
        **summary,
        "speed_ratio": summary["pax"]["tokens_per_sec"] / summary["bare"]["tokens_per_sec"],
        "first_step_ratio": summary["pax"]["first_step_sec"] / summary["bare"]["first_step_sec"],
        "samples": samples,
    }


def markdown(summary: dict) -> str:
    peaks = summary["matmul_peak_flops_per_sec"]
    lines = [
        "# Training speed: `pax train` vs a bare jit + optax loop",
        "",
        f"{summary['machine']}; one CPU device, float32; interleaved rounds; tokens/s is the "
        "median interval between summaries, first step (compile included) the median round.",
        f"XLA matmul peak: float32 {peaks['float32'] / 1e9:,.1f} GFLOP/s, "
        f"bfloat16 {peaks['bfloat16'] / 1e9:,.1f} GFLOP/s. MFU is against the float32 peak.",
        "",
        "| model | rounds | bare tokens/s | pax tokens/s | ratio | bare MFU | pax MFU | "
        "bare first step (s) | pax first step (s) | ratio | bare peak MiB | pax peak MiB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for m in summary["models"]:
        bare, pax = m["bare"], m["pax"]
        lines.append(
            f"| {m['model']} | {m['rounds']} | {bare['tokens_per_sec']:,.0f} | "
            f"{pax['tokens_per_sec']:,.0f} | "
            f"{m['speed_ratio']:.3f} | {bare['mfu']:.1%} | {pax['mfu']:.1%} | "
            f"{bare['first_step_sec']:.2f} | {pax['first_step_sec']:.2f} | "
            f"{m['first_step_ratio']:.2f} | {bare['peak_rss_mib']:,.0f} | "
            f"{pax['peak_rss_mib']:,.0f} |")
    lines += ["", f"Targets: tokens/s ratio >= {TARGET_SPEED}, first-step ratio <= "
              f"{TARGET_FIRST_STEP}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="rounds per model (default: 4)")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    started = time.perf_counter()
    peaks = matmul_peaks()
    print(f"matmul peak: float32 {peaks['float32'] / 1e9:,.1f} GFLOP/s, "
          f"bfloat16 {peaks['bfloat16'] / 1e9:,.1f} GFLOP/s", flush=True)
    models = [bench_model(MODELS[name], args.rounds or MODELS[name].rounds, peaks["float32"])
              for name in args.models.split(",")]
    summary = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "matmul_peak_flops_per_sec": peaks,
        "models": models,
        "wall_sec": time.perf_counter() - started,
    }
    folder = report.save("train_speed", summary, markdown(summary))
    print(f"({summary['wall_sec']:.0f} s; written to {folder})")


if __name__ == "__main__":
    main()
