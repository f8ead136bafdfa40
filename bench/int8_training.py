"""Int8 training on the quick-start LM: held-out log-perplexity after training in float and in
int8 (``QUANTIZE_TRAINING="int8"``, ``pax_lm.quantized_training``), on the same text, from the
same seeds, for the same steps.

Each model is ``QuickStartLm`` trained by ``pax train`` in a fresh process, as a user runs it
(600 steps, its default; ``--steps`` trains fewer, the learning-rate schedule shortened to
match), both computing in bfloat16 (the int8 run's unquantized parts too), the dtype int8
training is to replace on a TPU; ``--dtype float32`` is the quick start's own. Compared: the
last evaluation each job writes, its held-out ``log_pplx`` over the job's ``heldout`` input
(the int8 job evaluates with the int8 forward pass it trains with), and the int8 job's weights
run through its plain decoder in the compute dtype over the same batches (what ``pax score``
and ``pax decode`` run for it). The relative difference is ``(int8 - float) / float`` of the
means over the seeds; int8 training is to stay within 1 % of float.

Why several seeds (``--seeds``): float runs that differ only in their seed end 1 to 2 % apart
after 600 steps, and on a CPU the same run does not even repeat exactly (0.4 % apart once), as
far apart as the criterion itself, so one pair of runs cannot tell int8's effect from a run's
luck. Seed ``i`` > 0 moves both the initialisation (``task.train.random_seed``) and the
training data's order (``datasets[0].seed``); the held-out data stays the same.

Quality only: a CPU has no int8 matmul units, so the seconds here say nothing of the speed-up
on a TPU (``docs/speed.md`` says how that is measured).

    python bench/int8_training.py [--steps N] [--seeds K] [--dtype float32|bfloat16] [--work DIR]

Writes bench/results/int8_training.{json,md}; each run takes about 3 minutes on two cores,
the default 3 seeds about 20.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import report
from quantization import DEFAULT_STEPS, heldout, train

INT8 = "QUANTIZE_TRAINING='int8'"
FIRST_SEED = 1234  # the quick start's own (task.train.random_seed, datasets[0].seed)


def seed_settings(seed: int) -> list[str]:
    """The ``--set`` items that train from ``seed`` (none for the quick start's own)."""
    if seed == FIRST_SEED:
        return []
    return [f"task.train.random_seed={seed}", f"datasets[0].seed={seed}"]


def last_train_loss(job: Path) -> float:
    """The training loss of the job's last summary."""
    records = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if r.get("kind") == "train"][-1]["loss"]


def plain_heldout(job: Path) -> tuple[float, float]:
    """The held-out log-perplexity of the int8 job's latest checkpoint, through the decoder it
    trained with (int8 products) and through its plain decoder."""
    from pax_core import restore_latest
    from pax_core.plugins.host import PluginHost
    from pax_lm.quantized_training import plain

    run, state, _ = restore_latest(PluginHost(), exp=None, plugin=None, set_items=[],
                                   job_dir=str(job))
    variables = {name: collection["decoder"] for name, collection
                 in run.eval_variables(state).items() if "decoder" in collection}
    [data] = [d for d in run.eval_inputs if d.name == "heldout"]
    decoder = run.task.model.decoder
    trained, _ = heldout(decoder, variables, data)
    as_float, _ = heldout(plain(decoder), variables, data)
    return trained, as_float


def one_seed(folder: Path, seed: int, steps: int, dtype: str) -> dict[str, Any]:
    """Float and int8 trained from ``seed``: each run's figures."""
    runs: dict[str, Any] = {"seed": seed}
    for name, extra in (("float", []), ("int8", [INT8])):
        job = folder / f"quickstart_{name}_{seed}"
        settings = [f"FPROP_DTYPE='{dtype}'", *seed_settings(seed), *extra]
        runs[name] = {**train(job, steps, settings), "last_train_loss": last_train_loss(job)}
    trained, as_float = plain_heldout(folder / f"quickstart_int8_{seed}")
    recorded = runs["int8"]["heldout_log_perplexity"]
    if abs(trained - recorded) > 1e-3:
        raise SystemExit(f"the int8 job's log-perplexity here ({trained}) is not its own "
                         f"evaluation ({recorded})")
    runs["int8"]["plain_decoder_log_perplexity"] = as_float
    return runs


def summary(seeds: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over the seeds and int8's relative differences from float's mean."""
    def mean(arm: str, key: str) -> float:
        return statistics.fmean(s[arm][key] for s in seeds)

    full = mean("float", "heldout_log_perplexity")
    int8 = mean("int8", "heldout_log_perplexity")
    plain = mean("int8", "plain_decoder_log_perplexity")
    paired = [(s["int8"]["heldout_log_perplexity"] - s["float"]["heldout_log_perplexity"])
              / s["float"]["heldout_log_perplexity"] for s in seeds]
    floats = [s["float"]["heldout_log_perplexity"] for s in seeds]
    return {"float_mean": full, "int8_mean": int8, "int8_plain_decoder_mean": plain,
            "relative_difference": (int8 - full) / full,
            "plain_decoder_relative_difference": (plain - full) / full,
            "paired_relative_differences": paired,
            "float_spread": (max(floats) - min(floats)) / full}


def table(result: dict[str, Any]) -> str:
    dtype, steps, found = result["dtype"], result["steps"], result["summary"]
    rows = []
    for s in result["seeds"]:
        full, int8 = s["float"], s["int8"]
        change = (int8["heldout_log_perplexity"] - full["heldout_log_perplexity"]) / full[
            "heldout_log_perplexity"]
        rows.append(f"| {s['seed']} | {full['heldout_log_perplexity']:.4f} | "
                    f"{int8['heldout_log_perplexity']:.4f} | {100 * change:+.2f} % | "
                    f"{int8['plain_decoder_log_perplexity']:.4f} | "
                    f"{full['last_train_loss']:.4f} | {int8['last_train_loss']:.4f} |")
    spread = (f"; the float runs' held-out figures span {100 * found['float_spread']:.2f} % "
              f"of their mean" if len(result["seeds"]) > 1 else "")
    return "\n".join([
        f"# Int8 training on the quick-start LM ({steps} steps, compute dtype {dtype})",
        "",
        f"| seed | {dtype} held-out log-pplx | int8 training | int8 / {dtype} | int8 weights "
        f"in the plain decoder | {dtype} last train loss | int8 last train loss |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        f"| mean | {found['float_mean']:.4f} | {found['int8_mean']:.4f} | "
        f"{100 * found['relative_difference']:+.2f} % | "
        f"{found['int8_plain_decoder_mean']:.4f} | | |",
        "",
        "Held out: every batch of the job's `heldout` input, the int8 job evaluating with the "
        "int8 forward pass it trains with; the plain decoder runs its weights in the compute "
        f"dtype, as `pax score` does ({100 * found['plain_decoder_relative_difference']:+.2f} % "
        f"from {dtype}'s mean){spread}. int8 training runs the blocks' attention and "
        "feed-forward projections as int8 x int8 matmuls, forward and backward; the embedding, "
        "logits and attention's own products stay in the compute dtype.",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--seeds", type=int, default=3, help="Pairs of runs, each from its "
                        "own seed (default 3).")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16",
                        help="FPROP_DTYPE of both runs (default bfloat16; the quick start's "
                        "own is float32).")
    parser.add_argument("--work", type=Path, help="Where the jobs go (default: a temporary "
                        "folder, removed after).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.work or Path(scratch)
        seeds = [one_seed(folder, FIRST_SEED + 1000 * i, args.steps, args.dtype)
                 for i in range(args.seeds)]
    result = {"steps": args.steps, "dtype": args.dtype, "seeds": seeds,
              "summary": summary(seeds)}
    report.save("int8_training", result, table(result))


if __name__ == "__main__":
    main()
