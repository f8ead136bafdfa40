"""Fine-tuning the quick-start LM on a task whose answers are checked exactly: the base model,
full supervised fine-tuning (SFT), SFT of low-rank adapters (LoRA), and DPO, each measured on
prompts that no training saw.

The task: write five random lowercase letters in capitals (``upper qugrd`` -> ``QUGRD``). A
seeded draw gives 200 held-out words and 8,000 others to train on. The base model has never seen
the format; the task needs the letters copied from the prompt and mapped to their capitals,
which a 1.8M-weight byte-level model learns in a few hundred steps.

A second set of conversations answers the same prompts in one of two styles, drawn half and
half: all capitals (``QUGRD``) or a capital first (``Qugrd``), of one length, an answer right in
either. The preference pairs answer the same prompts, chosen all capitals and rejected a capital
first: supervised fine-tuning on both styles teaches the task and leaves the style to chance,
and DPO has to teach the preference.

Each model is a fresh ``pax train`` process, as a user runs it:

1. base: ``QuickStartLm`` on its own corpus, briefly;
2. full SFT: ``--init-from`` the base job with ``SFT_DATA`` (every weight trains, Adam starts
   afresh);
3. LoRA SFT: the same with ``LORA_RANK`` adapters on the attention projections, the base frozen;
4. SFT on both styles: as full SFT, on the conversations of both styles;
5. full DPO: ``--init-from`` that job with ``DPO_DATA``: every weight trains, against a frozen
   copy of the model it starts from;
6. LoRA DPO: ``--init-from`` that job with ``DPO_DATA`` and fresh adapters: the reference holds
   a copy of them as they start, so it is the same model, without a copy of its weights.

A training process's peak resident memory is its own rusage (``wait4``); this process never
imports JAX, since a child's high-water mark starts from the size of the process it was forked
from. The measurements run in a child too, on each job's latest checkpoint
(``pax_core.restore_latest``): exact match by greedy decoding of every held-out prompt at once
(the answer is the text after the prompt up to eos or a newline, right in either style; the
first prompts are decoded again with ``pax_lm.inference.generate``, which ``pax decode`` runs,
and must agree), and the share of the answers in the preferred style (all capitals); for
every job the fraction of held-out pairs whose chosen answer is the likelier; for DPO jobs the
held-out preference accuracy and reward margin as DPO's metrics define them (against the job's
own reference); the trained parameters, the bytes of the checkpoint's optimizer state and of
the reference's frozen copy.

    python bench/finetune.py [--work DIR] [--seed N]

Writes bench/results/finetune.{json,md}. Linux (``ru_maxrss`` in KiB).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import report

SEED = 0  # the task's words (``--seed`` draws others)
LETTERS, HELD_OUT, TRAINING = 5, 200, 8000
NEW_TOKENS = 8  # decoded per prompt: the answer and its eos, with room to overrun
CHECKED = 8  # held-out prompts decoded again with pax_lm.inference.generate
EXP = ["--plugin", "lm", "--exp", "QuickStartLm"]
LORA = ["LORA_RANK=4", "LORA_ALPHA=16", "LORA_TARGETS=('query','key','value','output')"]
BETA = 0.1  # DPO's strength, and the scale of the reward margins reported


def schedule(steps: int, learning_rate: float, warmup: int = 30) -> list[str]:
    """A linear warm-up and a cosine decay over ``steps``."""
    return [f"NUM_TRAIN_STEPS={steps}", f"LEARNING_RATE={learning_rate}",
            f"LR_COS_WARMUP={warmup}", f"LR_COS_DECAY_START={warmup}",
            f"LR_COS_DECAY_END={steps}", f"EVAL_INTERVAL_STEPS={steps}",
            f"CHECKPOINT_EVERY_N_STEPS={steps}"]


def runs(data: Path) -> dict[str, tuple[str | None, list[str]]]:
    """Each model: the job it starts from (``--init-from``) and its ``--set`` items."""
    sft = [f"SFT_DATA={data / 'train_sft.jsonl'}"]
    styles = [f"SFT_DATA={data / 'train_styles.jsonl'}"]
    dpo = [f"DPO_DATA={data / 'train_dpo.jsonl'}", f"DPO_BETA={BETA}", "MAX_SEQ_LEN=48"]
    return {
        "base": (None, ["NUM_TRAIN_STEPS=300", "LR_COS_DECAY_END=300"]),
        "full SFT": ("base", [*sft, *schedule(300, 3e-3)]),
        "LoRA SFT": ("base", [*sft, *LORA, *schedule(1000, 1e-3)]),
        "SFT on both styles": ("base", [*styles, *schedule(300, 3e-3)]),
        "full DPO": ("SFT on both styles", [*dpo, *schedule(200, 2e-5, warmup=10)]),
        "LoRA DPO": ("SFT on both styles", [*dpo, *LORA, *schedule(200, 5e-5, warmup=10)]),
    }


def write_task(data: Path, seed: int = SEED) -> dict[str, int]:
    """The conversations and preference pairs, training and held out, as JSONL files."""
    rng = random.Random(seed)
    words: dict[str, None] = {}
    while len(words) < HELD_OUT + TRAINING:
        words["".join(rng.choices(string.ascii_lowercase, k=LETTERS))] = None
    drawn = list(words)
    for split, chosen in (("heldout", drawn[:HELD_OUT]), ("train", drawn[HELD_OUT:])):
        sft, styles, dpo = [], [], []
        for word in chosen:
            prompt, capitals, first = f"upper {word}", word.upper(), word.capitalize()
            sft.append({"prompt": prompt, "response": capitals})
            styles.append({"prompt": prompt, "response": rng.choice((capitals, first))})
            dpo.append({"prompt": prompt, "chosen": capitals, "rejected": first})
        for name, lines in ((f"{split}_sft", sft), (f"{split}_styles", styles),
                            (f"{split}_dpo", dpo)):
            (data / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return {"held_out": HELD_OUT, "training": TRAINING}


def train(job: Path, source: Path | None, sets: list[str]) -> dict[str, Any]:
    """One ``pax train`` in a fresh process: its command, seconds, peak resident MiB (its own
    rusage) and its last training metrics."""
    pax = str(Path(sys.executable).with_name("pax"))
    command = [pax, "train", *EXP, "--job-dir", str(job)]
    command += ["--init-from", str(source)] if source else []
    command += [a for s in sets for a in ("--set", s)]
    log = job.with_suffix(".log")
    with log.open("w") as out:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-15:])
        raise SystemExit(f"{shlex.join(command)} failed:\n{tail}")
    records = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in records if r.get("kind") == "train"][-1]
    return {"command": shlex.join(command), "seconds": seconds,
            "peak_mib": usage.ru_maxrss / 1024,
            "final_train_metrics": {k: v for k, v in last.items() if k in (
                "step", "loss", "preference_accuracy", "reward_margin")}}


def measure(job: str, data: Path) -> dict[str, Any]:
    """The job's latest checkpoint on the held-out prompts and pairs (runs in a child)."""
    import jax
    import numpy as np

    from pax_core import restore_latest
    from pax_core.plugins.host import PluginHost
    from pax_lm.decoding import SamplingSettings
    from pax_lm.dpo.model import DpoLanguageModel
    from pax_lm.dpo.pairs import read_pairs
    from pax_lm.inference import generate
    from pax_lm.sft.templates import chat_template

    run, state, step = restore_latest(PluginHost(), exp=None, plugin=None, set_items=[],
                                      job_dir=job)
    tokenizer, decoder = run.train_input.tokenizer, run.task.model.decoder
    params = jax.device_get(state.params)["decoder"]
    forward = jax.jit(decoder.apply)
    pairs = read_pairs(data / "heldout_dpo.jsonl")
    rows = chat_template(tokenizer, None).encode(
        [p.conversation(a) for p in pairs for a in (p.chosen, p.rejected)], tokenizer,
        last_only=True)
    # A prompt is what precedes its answer's first trained token.
    prompts = [ids[: int(np.argmax(trained))] for ids, trained in rows[::2]]

    def answer(tokens: list[int]) -> str:
        if tokenizer.eos_id in tokens:
            tokens = tokens[: tokens.index(tokenizer.eos_id)]
        return tokenizer.decode(tokens).split("\n")[0]

    # Greedy decoding of all prompts at once: one forward pass per new token over rows padded
    # on the right (causal attention keeps the padding out of every prompt).
    lengths = np.array([len(p) for p in prompts])
    ids = np.full((len(prompts), lengths.max() + NEW_TOKENS), tokenizer.pad_id, np.int32)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = p
    at = np.arange(len(prompts))
    for k in range(NEW_TOKENS):
        logits = forward({"params": params}, ids)[at, lengths - 1 + k]
        ids[at, lengths + k] = np.argmax(np.asarray(logits), axis=-1)
    answers = [answer(list(row[n:])) for row, n in zip(ids, lengths, strict=True)]
    checked = [answer(generate(decoder, {"params": params}, [int(t) for t in p],
                               SamplingSettings(max_tokens=NEW_TOKENS),
                               eos_id=tokenizer.eos_id)) for p in prompts[:CHECKED]]
    if checked != answers[:CHECKED]:
        raise SystemExit(f"{job}: batched greedy decoding {answers[:CHECKED]} differs from "
                         f"pax_lm.inference.generate's {checked}")

    width = max(len(t) for t, _ in rows)
    tokens, weights = np.zeros((len(rows), width), np.int32), np.zeros((len(rows), width))
    for i, (t, w) in enumerate(rows):
        tokens[i, : len(t)], weights[i, : len(t)] = t, w
    logp = jax.nn.log_softmax(forward({"params": params}, tokens[:, :-1]))
    picked = np.take_along_axis(np.asarray(logp), tokens[:, 1:, None], -1)[..., 0]
    policy = (picked * weights[:, 1:]).sum(-1).reshape(-1, 2)  # [pairs, (chosen, rejected)]
    leaves = {"/".join(str(k.key) for k in path): leaf
              for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]}
    adapters = sum(v.size for k, v in leaves.items() if k.rsplit("/", 1)[-1].startswith("lora_"))
    result = {
        "step": int(step),
        "exact_match": float(np.mean([a in (p.chosen, p.rejected) for a, p in zip(
            answers, pairs, strict=True)])),
        "capitals_style": float(np.mean([a == p.chosen for a, p in zip(answers, pairs,
                                                                    strict=True)])),
        "wrong_answers": [[p.chosen, a] for p, a in zip(pairs, answers, strict=True)
                          if a not in (p.chosen, p.rejected)][:20],
        "decoding_checked_against_generate": CHECKED,
        "prefers_chosen": float(np.mean(policy[:, 0] > policy[:, 1])),
        "parameters": int(sum(v.size for v in leaves.values())),
        "trained_parameters": int(adapters or sum(v.size for v in leaves.values())),
        "optimizer_state_bytes": int(sum(np.asarray(x).nbytes
                                         for x in jax.tree.leaves(state.opt_state))),
        "optimizer_state_leaves": len(jax.tree.leaves(state.opt_state)),
    }
    if isinstance(run.task.model, DpoLanguageModel):  # against the job's own reference
        batch = {"ids": tokens[:, :-1], "labels": tokens[:, 1:],
                 "weights": weights[:, 1:].astype(np.float32)}
        batch = {k: v.reshape(len(pairs), 2, -1) for k, v in batch.items()}
        tuned, reference = jax.jit(run.task.model.apply, static_argnames="method")(
            {"params": state.params}, batch, method="log_probs")
        np.testing.assert_allclose(tuned, policy, rtol=1e-4, atol=1e-3)
        margin = np.asarray(tuned) - np.asarray(reference)
        result["preference_accuracy"] = float(np.mean(margin[:, 0] > margin[:, 1]))
        result["reward_margin"] = float(np.mean(BETA * (margin[:, 0] - margin[:, 1])))
        result["reference_copy_bytes"] = int(sum(np.asarray(x).nbytes for x in jax.tree.leaves(
            state.params["reference"])))
    return result


def measured(job: Path, data: Path) -> dict[str, Any]:
    """``measure`` in a child process."""
    out = job.with_suffix(".measured.json")
    done = subprocess.run([sys.executable, __file__, "--measure", str(job), "--data", str(data),
                           "--out", str(out)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"measuring {job} failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())


def table(results: dict[str, dict[str, Any]], total: float) -> str:
    """The markdown table, and what it shows in a few lines."""
    lines = [f"# Fine-tuning the quick-start LM: exact match on {HELD_OUT} held-out prompts",
             "", "| model | steps | exact match | all capitals | prefers chosen | preference "
             "accuracy | reward margin | trained parameters | optimizer state | reference copy | "
             "peak resident (MiB) | seconds |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        share = r["trained_parameters"] / r["parameters"]
        dpo = [f"{r[k]:.3f}" if k in r else "-" for k in ("preference_accuracy",
                                                          "reward_margin")]
        copy = (f"{r['reference_copy_bytes'] / 1024:,.0f} KiB" if "reference_copy_bytes" in r
                else "-")
        lines.append(
            f"| {name} | {r['step']} | {r['exact_match']:.3f} | {r['capitals_style']:.3f} | "
            f"{r['prefers_chosen']:.3f} | "
            f"{' | '.join(dpo)} | {r['trained_parameters']:,} ({share:.2%}) | "
            f"{r['optimizer_state_bytes'] / 1024:,.0f} KiB | {copy} | {r['peak_mib']:.0f} | "
            f"{r['seconds']:.0f} |")
    lines.append("")
    base = results["base"]["exact_match"]
    full, lora = (results[k]["exact_match"] - base for k in ("full SFT", "LoRA SFT"))
    if full > 0:
        lines.append(f"LoRA SFT reaches {lora / full:.1%} of full SFT's gain in exact match.")
    lines.append(f"Exact match: answers right in either style; all capitals: the share of the "
                 f"{HELD_OUT} answers in the preferred style. Prefers chosen: the fraction of "
                 f"the held-out pairs whose all-capitals answer the model finds likelier than "
                 f"the one with a capital first. Preference accuracy "
                 f"(DPO's own metric) and reward margin (its mean, beta {BETA}): how the "
                 f"log-probability DPO moved the chosen answer from its reference's compares "
                 f"with the rejected one's. Reference copy: the DPO job's frozen copy of the "
                 f"weights it trains (no optimizer state). Trained parameters: their share of "
                 f"the model's, adapters included. Steps: the row's own `pax train`; seconds: "
                 f"its process, start-up included; {total / 60:.1f} minutes in all.")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", metavar="DIR", help="keep the data and jobs here (default: a "
                        "temporary folder, removed after)")
    parser.add_argument("--seed", type=int, default=SEED,
                        help="draw the task's words from this seed (how much a row owes to them)")
    parser.add_argument("--measure", metavar="JOB", help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        Path(args.out).write_text(json.dumps(measure(args.measure, Path(args.data))))
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pax-finetune-bench-") as tmp:
        work = Path(args.work or tmp)
        data = work / "data"
        data.mkdir(parents=True, exist_ok=True)
        task = write_task(data, args.seed)
        plan, results = runs(data), {}
        for name, (source, sets) in plan.items():
            job = work / name.replace(" ", "_")
            trained = train(job, source and work / source.replace(" ", "_"), sets)
            results[name] = {**trained, **measured(job, data)}
            print(f"{name}: exact match {results[name]['exact_match']:.3f}, "
                  f"{trained['seconds']:.0f} s", flush=True)
    total = time.perf_counter() - started
    settings = {"task": f"upper WORD -> WORD in capitals, {LETTERS} random lowercase letters; "
                        f"the styles set: all capitals or the first; pairs prefer all capitals",
                "task_seed": args.seed, **task, "experiment": "QuickStartLm",
                "pax_seeds": "the experiment's own: task.train.random_seed 1234, inputs 1234 "
                             "(training) and 4321 (held out)",
                "runs": {k: {"init_from": s, "set": v} for k, (s, v) in plan.items()},
                "decoding": f"greedy, at most {NEW_TOKENS} tokens"}
    report.save("finetune", {"settings": settings, "results": results, "total_seconds": total},
                table(results, total))


if __name__ == "__main__":
    main()
