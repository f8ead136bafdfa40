"""Int8 weights on the quick-start LM: held-out log-perplexity and decoder weight bytes, float
against int8 (``pax_lm.quantization``, what ``pax score --quantize int8`` runs).

The model is ``QuickStartLm`` trained by ``pax train`` in a fresh process, as a user runs it
(600 steps, its default; ``--steps`` trains fewer, the learning-rate schedule shortened to
match). Its latest checkpoint is then restored here (``pax_core.restore_latest``) and its
decoder run as is and with int8 weights over every batch of the job's own held-out input (the
one ``pax eval`` reads): the log-perplexity is the mean cross-entropy per predicted token
(natural log, the job's ``log_pplx``), and the greedy agreement the share of those
predictions whose likeliest token is the same in both. The float figure is checked against
the job's own last evaluation. Bytes are every array of the decoder's parameters: float32, and
with the projection kernels as int8 values plus their per-channel float32 scales.

    python bench/quantization.py [--steps N] [--work DIR]

Writes bench/results/quantization.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import report

DEFAULT_STEPS = 600  # QuickStartLm's own NUM_TRAIN_STEPS and LR_COS_DECAY_END


def train(job: Path, steps: int, settings: Sequence[str] = ()) -> dict[str, Any]:
    """``pax train --exp QuickStartLm`` for ``steps`` steps in a fresh process, with any
    further ``--set`` ``settings``; its command, seconds and the held-out log-perplexity of
    its last evaluation."""
    pax = str(Path(sys.executable).with_name("pax"))
    warmup = max(1, steps * 50 // DEFAULT_STEPS)  # the quick start's 50 of 600, scaled
    sets = [f"NUM_TRAIN_STEPS={steps}", f"LR_COS_WARMUP={warmup}",
            f"LR_COS_DECAY_START={warmup}", f"LR_COS_DECAY_END={steps}",
            f"EVAL_INTERVAL_STEPS={steps}", f"CHECKPOINT_EVERY_N_STEPS={steps}", *settings]
    command = [pax, "train", "--plugin", "lm", "--exp", "QuickStartLm", "--job-dir", str(job),
               *(a for s in sets for a in ("--set", s))]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stdout[-3000:]}"
                         f"{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    [last] = [r for r in records if r.get("kind") == "eval/heldout" and r["step"] == steps]
    return {"command": shlex.join(command), "seconds": round(time.perf_counter() - started, 1),
            "heldout_log_perplexity": last["log_pplx"]}


def heldout(decoder: Any, variables: dict[str, Any], data: Any) -> tuple[float, Any]:
    """The log-perplexity of ``decoder`` over every batch of the eval input ``data``, and its
    greedy predictions (a list of per-batch arrays, padding included, with their weights)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax

    @jax.jit
    def step(variables: Any, batch: dict[str, Any]) -> tuple[Any, Any, Any]:
        logits = decoder.apply(variables, batch["ids"], segment_ids=batch.get("segment_ids"),
                               positions=batch.get("segment_pos")).astype(jnp.float32)
        xent = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
        return jnp.sum(xent * batch["weights"]), jnp.sum(batch["weights"]), jnp.argmax(logits,
                                                                                       -1)

    data.reset()
    total = count = 0.0
    predictions = []
    while data.eval_num_batches < 0 or len(predictions) < data.eval_num_batches:
        try:
            batch = data.get_next()
        except StopIteration:
            break
        xent, weight, greedy = jax.device_get(step(variables, batch))
        total, count = total + float(xent), count + float(weight)
        predictions.append((np.asarray(greedy), np.asarray(batch["weights"])))
    return total / count, predictions


def measure(job: Path) -> dict[str, Any]:
    """Float and int8 on the job's latest checkpoint."""
    import flax.linen as nn
    import jax
    import numpy as np

    from pax_core import restore_latest
    from pax_core.plugins.host import PluginHost
    from pax_lm.quantization import quantize, weight_bytes

    run, state, step = restore_latest(PluginHost(), exp=None, plugin=None, set_items=[],
                                      job_dir=str(job))
    variables = {name: collection["decoder"] for name, collection
                 in run.eval_variables(state).items() if "decoder" in collection}
    decoder = run.task.model.decoder
    started = time.perf_counter()
    qdecoder, qvariables = quantize(decoder, variables, "int8")
    quantize_seconds = time.perf_counter() - started
    [data] = [d for d in run.eval_inputs if d.name == "heldout"]
    full, full_greedy = heldout(decoder, variables, data)
    int8, int8_greedy = heldout(qdecoder, qvariables, data)
    same = sum(float(np.sum((a == b) * w)) for (a, w), (b, _) in zip(full_greedy, int8_greedy,
                                                                       strict=True))
    predicted = sum(float(np.sum(w)) for _, w in full_greedy)

    params, qparams = nn.unbox(variables["params"]), qvariables["params"]
    kernels = {"float32": 0, "int8": 0}
    for path, leaf in jax.tree_util.tree_leaves_with_path(qparams, is_leaf=lambda x: hasattr(
            x, "array")):
        if hasattr(leaf, "array"):
            kernels["int8"] += weight_bytes(leaf)
            kernels["float32"] += weight_bytes(_at(params, path))
    return {
        "step": step, "heldout_tokens": predicted,
        "log_perplexity": {"float32": full, "int8": int8, "int8_minus_float32": int8 - full},
        "greedy_agreement": same / predicted,
        "decoder_weight_bytes": {"float32": weight_bytes(params), "int8": weight_bytes(qparams)},
        "projection_kernel_bytes": kernels,
        "embedding_bytes": weight_bytes(params["embedding"]),
        "quantize_seconds": round(quantize_seconds, 2),
    }


def _at(tree: Any, path: tuple[Any, ...]) -> Any:
    """The subtree of ``tree`` at a key path of dict keys."""
    for key in path:
        tree = tree[key.key]
    return tree


def table(result: dict[str, Any]) -> str:
    lp, size, kernels = (result["log_perplexity"], result["decoder_weight_bytes"],
                         result["projection_kernel_bytes"])
    trained = result["training"]
    return "\n".join([
        f"# Int8 weights on the quick-start LM ({trained['steps']} training steps)",
        "",
        "| | float32 | int8 | int8 / float32 |",
        "|---|---:|---:|---:|",
        f"| held-out log-perplexity | {lp['float32']:.4f} | {lp['int8']:.4f} | "
        f"{lp['int8_minus_float32']:+.5f} (difference) |",
        f"| decoder weight bytes | {size['float32']:,} | {size['int8']:,} | "
        f"{size['int8'] / size['float32']:.3f} |",
        f"| projection kernel bytes | {kernels['float32']:,} | {kernels['int8']:,} | "
        f"{kernels['int8'] / kernels['float32']:.3f} |",
        "",
        f"Held out: {result['heldout_tokens']:,.0f} predicted tokens of the job's `heldout` "
        f"input; greedy predictions agree on {100 * result['greedy_agreement']:.2f}% of them. "
        f"The token embedding ({result['embedding_bytes']:,} bytes; the tied output head) "
        f"stays float32. Quantizing took {result['quantize_seconds']} s.",
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--work", type=Path, help="Where the job goes (default: a temporary "
                        "folder, removed after).")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        job = (args.work or Path(scratch)) / "quickstart"
        trained = {"steps": args.steps, **train(job, args.steps)}
        result = {"training": trained, **measure(job)}
    recorded = trained["heldout_log_perplexity"]
    if abs(recorded - result["log_perplexity"]["float32"]) > 1e-3:
        raise SystemExit(f"the float log-perplexity here ({result['log_perplexity']['float32']})"
                         f" is not the job's own evaluation ({recorded})")
    report.save("quantization", result, table(result))


if __name__ == "__main__":
    main()
