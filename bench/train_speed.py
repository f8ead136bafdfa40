"""Training speed, start-up and memory of `pax train` against hand-written code, on CPU in
float32.

Three programs train the same model on the same batches with the same optimizer, in separate
processes, interleaved round by round:

* hand: `bench/handwritten.py`, the model written directly in flax linen and trained with
  optax by a plain loop, nothing from Pax (the independent baseline; checked first to compute
  the same loss as Pax's model from the same weights);
* bare: `bench/bare_loop.py`, Pax's model in that plain loop (so pax / bare is the loop's cost
  and bare / hand the layers');
* pax: `pax train`, with an empty compilation cache (cold), then again with the cache it filled
  (warm: the first step without compiling).

For the quick-start LM (GPT-style, 1.8M), a llama-style 25M LM (also plain: Adam alone on
unpacked random tokens, against a loop that computes the loss and the update and nothing else)
and a 50M GPT. Reported:
tokens/s (median interval between summaries after a warm-up), the whole run's wall time, launch
to the end of the first step, the first step itself (compile included) cold and warm (also
less one step's execution, which no cache removes), and peak resident memory (hand and pax
each save a final checkpoint); medians over the rounds.
Targets: tokens/s >= 0.98 x hand; whole run <= hand + 3 s; warm first step <= 0.5 x cold; peak
memory <= 1.1 x hand.

    python bench/train_speed.py [--rounds N] [--models quickstart,llama25m,llama25m-plain,lm50m]

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
TARGETS = {"speed": 0.98, "wall_extra_sec": 3.0, "warm_first_step": 0.5, "memory": 1.1}
KINDS = ("hand", "bare", "pax")


@dataclasses.dataclass(frozen=True)
class Model:
    name: str
    exp: str
    steps: int
    warmup: int  # also the summary interval: tokens/s is timed from this summary to the last
    rounds: int

    def overrides(self, steps: int | None = None) -> list[str]:
        steps = steps or self.steps
        never = steps + 1
        return [f"NUM_TRAIN_STEPS={steps}", f"SUMMARY_INTERVAL_STEPS={self.warmup}",
                f"EVAL_INTERVAL_STEPS={never}", f"CHECKPOINT_EVERY_N_STEPS={never}"]


MODELS = {
    # Six rounds: on a shared machine a process can run 10 to 15% slower from start to end,
    # whichever program it is; with four rounds one program can draw that more than another.
    "quickstart": Model("quick-start GPT (1.8M)", "lm/QuickStartLm", steps=30, warmup=5,
                        rounds=6),
    "llama25m": Model("llama-style LM (25M)", f"{HERE / 'models.py'}:BenchLlama25M", steps=30,
                      warmup=5, rounds=3),
    # The same model with nothing asked beyond the loss and Adam's update (no clipping, decay or
    # schedule; unpacked random tokens), against the plain loop a user writes for that.
    "llama25m-plain": Model("llama-style LM (25M), plain", f"{HERE / 'models.py'}:"
                            "BenchLlama25MPlain", steps=30, warmup=5, rounds=3),
    "lm50m": Model("GPT LM (50M)", f"{HERE / 'models.py'}:BenchLm50M", steps=30, warmup=5,
                   rounds=3),
}


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return {**env, "JAX_PLATFORMS": "cpu", **extra}


def _run(argv: list[str], log: Path, **env: str) -> tuple[str, float, float]:
    """Run a child; its stdout, peak resident memory in MiB (``wait4``) and wall seconds."""
    started = time.perf_counter()
    with open(log, "w") as out:
        child = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                 env=_environment(**env))
        _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - started
    text = log.read_text()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{text[-3000:]}")
    return text, usage.ru_maxrss / 1024, wall


def _last_json(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def run_hand(model: Model, work: Path, config: dict) -> dict:
    argv = [sys.executable, str(HERE / "handwritten.py"), "--batches", str(work / "batches.npz"),
            "--config", json.dumps(config), "--warmup", str(model.warmup),
            "--checkpoint", str(work / "hand_checkpoint")]
    out, rss, wall = _run(argv, work / "hand.log")
    subprocess.run(["rm", "-rf", str(work / "hand_checkpoint")], check=True)
    return {**_last_json(out), "peak_rss_mib": rss, "wall_sec": wall}


def run_bare(model: Model, work: Path) -> dict:
    argv = [sys.executable, str(HERE / "bare_loop.py"), "--exp", model.exp,
            "--steps", str(model.steps), "--warmup", str(model.warmup)]
    for item in model.overrides():
        argv += ["--set", item]
    out, rss, wall = _run(argv, work / "bare.log")
    return {**_last_json(out), "peak_rss_mib": rss, "wall_sec": wall}


def _pax_train(model: Model, job_dir: Path, cache: Path, log: Path, steps: int | None = None
               ) -> tuple[list[dict], float, float]:
    argv = [PAX, "train", "--exp", model.exp, "--job-dir", str(job_dir), "--no-eval-on-test"]
    for item in model.overrides(steps):
        argv += ["--set", item]
    _, rss, wall = _run(argv, log, PAX_COMPILATION_CACHE=str(cache))
    records = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    return records, rss, wall


def run_pax(model: Model, work: Path, index: int) -> dict:
    """A cold run (empty compilation cache), then a short warm one reading what it cached."""
    cache = work / f"cache-{index}"
    records, rss, wall = _pax_train(model, work / f"pax-{index}", cache, work / "pax.log")
    train = [r for r in records if r["kind"] == "train"]
    tokens_per_step = train[-1]["num_predictions"]
    warm, _, _ = _pax_train(model, work / f"pax-warm-{index}", cache, work / "pax-warm.log",
                            steps=2)
    # Timed like the other two: between the wall-clock stamps of consecutive summaries.
    intervals = [(b["step"] - a["step"]) * tokens_per_step / (b["time"] - a["time"])
                 for a, b in itertools.pairwise(train) if a["step"] >= model.warmup]
    return {
        "interval_tokens_per_sec": intervals,
        "tokens_per_step": tokens_per_step,
        "first_step_sec": train[0]["first_step_sec"],
        "startup_sec": train[0]["startup_sec"],
        "warm_first_step_sec": next(r for r in warm if r["kind"] == "train")["first_step_sec"],
        "losses": {str(r["step"]): r["loss"] for r in train},
        "flops_per_token": next(r for r in records if r["kind"] == "start")
        ["model_flops_per_step"] / tokens_per_step,
        "peak_rss_mib": rss,
        "wall_sec": wall,
    }


def prepare(model: Model, work: Path) -> dict:
    """The batches every program trains on, and the hand-written model's settings; checks that
    the hand-written model computes Pax's loss from Pax's initial weights (in a child, so
    that this process does not start JAX)."""
    argv = [sys.executable, str(HERE / "same_math.py"), "--exp", model.exp,
            "--steps", str(model.steps), "--batches", str(work / "batches.npz")]
    for item in model.overrides():
        argv += ["--set", item]
    out, _, _ = _run(argv, work / "prepare.log")
    checked = _last_json(out)
    print(f"  {model.name}: hand-written loss {checked['hand_loss']:.6f}, Pax's "
          f"{checked['pax_loss']:.6f} from the same weights", flush=True)
    return checked


def matmul_peaks() -> dict[str, float]:
    code = ("import json, jax.numpy as jnp; from pax_core.speed.peak import matmul_flops_per_sec;"
            "print(json.dumps({n: max(matmul_flops_per_sec(d, s) for s in (1024, 2048)) for n, d "
            "in (('float32', jnp.float32), ('bfloat16', jnp.bfloat16))}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=_environment(), check=True).stdout
    return _last_json(out)


def _summary(runs: list[dict], peak_f32: float, flops_per_token: float) -> dict:
    # The median interval over all rounds: one slow interval (a noisy neighbour) or one lucky
    # one moves it little.
    speed = statistics.median(x for s in runs for x in s["interval_tokens_per_sec"])
    summary = {"tokens_per_sec": speed, "mfu": speed * flops_per_token / peak_f32}
    # Medians of the rounds for the rest, peak memory included: a step's temporaries meet the
    # states in flight at slightly different moments from run to run.
    for key in ("first_step_sec", "startup_sec", "wall_sec", "warm_first_step_sec",
                "peak_rss_mib"):
        if key in runs[0]:
            summary[key] = statistics.median(s[key] for s in runs)
    return summary


def bench_model(model: Model, rounds: int, peak_f32: float) -> dict:
    samples: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        checked = prepare(model, work)
        for r in range(rounds):
            order = KINDS[r % 3:] + KINDS[:r % 3]  # each program goes first in turn
            for kind in order:
                result = (run_hand(model, work, checked["config"]) if kind == "hand"
                          else run_bare(model, work) if kind == "bare"
                          else run_pax(model, work, r))
                samples[kind].append(result)
                rates = ", ".join(f"{x:,.0f}" for x in result["interval_tokens_per_sec"])
                print(f"  {model.name} round {r + 1} {kind}: tokens/s per interval {rates}; "
                      f"first step {result['first_step_sec']:.2f} s; whole run "
                      f"{result['wall_sec']:.1f} s; peak {result['peak_rss_mib']:,.0f} MiB",
                      flush=True)
    flops_per_token = samples["pax"][0]["flops_per_token"]
    summary = {kind: _summary(runs, peak_f32, flops_per_token) for kind, runs in samples.items()}
    hand, bare, pax = summary["hand"], summary["bare"], summary["pax"]
    step_sec = samples["pax"][0]["tokens_per_step"] / pax["tokens_per_sec"]
    return {
        "model": model.name,
        "experiment": model.exp.replace(str(HERE.parent) + "/", ""),
        "rounds": rounds,
        "steps": model.steps,
        "flops_per_token": flops_per_token,
        "same_math": {k: checked[k] for k in ("hand_loss", "pax_loss")},
        **summary,
        "speed_vs_hand": pax["tokens_per_sec"] / hand["tokens_per_sec"],
        "speed_vs_bare": pax["tokens_per_sec"] / bare["tokens_per_sec"],
        "layers_vs_hand": bare["tokens_per_sec"] / hand["tokens_per_sec"],
        "wall_extra_sec": pax["wall_sec"] - hand["wall_sec"],
        "warm_first_step_ratio": pax["warm_first_step_sec"] / pax["first_step_sec"],
        # What the cache can save: the first step less one step's execution, warm over cold.
        "warm_compile_ratio": (pax["warm_first_step_sec"] - step_sec)
        / (pax["first_step_sec"] - step_sec),
        "step_sec": step_sec,
        "memory_vs_hand": pax["peak_rss_mib"] / hand["peak_rss_mib"],
        "samples": samples,
    }


def markdown(summary: dict) -> str:
    peaks = summary["matmul_peak_flops_per_sec"]
    lines = [
        "# Training speed: `pax train` against hand-written flax + optax",
        "",
        f"{summary['machine']}; one CPU device, float32; interleaved rounds; tokens/s is the "
        "median interval between summaries after the warm-up, times the median round.",
        f"XLA matmul peak: float32 {peaks['float32'] / 1e9:,.1f} GFLOP/s, "
        f"bfloat16 {peaks['bfloat16'] / 1e9:,.1f} GFLOP/s. MFU is against the float32 peak.",
        "",
        "| model | rounds | hand tokens/s | bare | pax | pax/hand | pax/bare | bare/hand | "
        "pax MFU | measured at |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for m in summary["models"]:
        hand, bare, pax = m["hand"], m["bare"], m["pax"]
        lines.append(
            f"| {m['model']} | {m['rounds']} | {hand['tokens_per_sec']:,.0f} | "
            f"{bare['tokens_per_sec']:,.0f} | {pax['tokens_per_sec']:,.0f} | "
            f"{m['speed_vs_hand']:.3f} | {m['speed_vs_bare']:.3f} | {m['layers_vs_hand']:.3f} | "
            f"{pax['mfu']:.1%} | {report.describe(m['provenance'])} |")
    lines += [
        "",
        "| model | whole run hand (s) | pax (s) | pax - hand | launch to first step hand (s) | "
        "pax (s) | pax first step cold (s) | warm (s) | warm/cold | a step (s) | warm/cold "
        "less a step | peak MiB hand | pax | pax/hand |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
        "---: | ---: |",
    ]
    for m in summary["models"]:
        hand, pax = m["hand"], m["pax"]
        lines.append(
            f"| {m['model']} | {hand['wall_sec']:.1f} | {pax['wall_sec']:.1f} | "
            f"{m['wall_extra_sec']:+.1f} | {hand['startup_sec']:.2f} | {pax['startup_sec']:.2f} | "
            f"{pax['first_step_sec']:.2f} | {pax['warm_first_step_sec']:.2f} | "
            f"{m['warm_first_step_ratio']:.2f} | {m['step_sec']:.2f} | "
            f"{m['warm_compile_ratio']:.2f} | {hand['peak_rss_mib']:,.0f} | "
            f"{pax['peak_rss_mib']:,.0f} | {m['memory_vs_hand']:.2f} |")
    lines += ["", f"Targets: pax/hand tokens/s >= {TARGETS['speed']}; whole run <= hand + "
              f"{TARGETS['wall_extra_sec']:.0f} s; warm first step <= "
              f"{TARGETS['warm_first_step']} x cold; peak memory <= {TARGETS['memory']} x hand.",
              "", "A first step is its compilation (or, warm, the cache's read) and one step's "
              "execution; \"warm/cold less a step\" leaves the execution out of both."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, help="rounds per model (default: the model's)")
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    started = time.perf_counter()
    peaks = matmul_peaks()
    print(f"matmul peak: float32 {peaks['float32'] / 1e9:,.1f} GFLOP/s, "
          f"bfloat16 {peaks['bfloat16'] / 1e9:,.1f} GFLOP/s", flush=True)
    models = [{**bench_model(MODELS[name], args.rounds or MODELS[name].rounds,
                             peaks["float32"]), "provenance": report.provenance()}
              for name in args.models.split(",")]
    summary = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        "matmul_peak_flops_per_sec": peaks,
        "models": models,
        "wall_sec": time.perf_counter() - started,
    }
    summary["models"] = report.kept("train_speed", "models", "model", models) + models
    folder = report.save("train_speed", summary, markdown(summary))
    print(f"({summary['wall_sec']:.0f} s; written to {folder})")


if __name__ == "__main__":
    main()
