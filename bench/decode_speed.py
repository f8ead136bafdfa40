"""Greedy decoding speed on this CPU: Pax's engine (``pax_lm.inference``: ``Batcher`` over
``Engine`` slots, what ``pax decode --prompts`` runs) against a KV-cache loop written by hand
in JAX and against Hugging Face transformers' ``generate`` (torch), on one model.

The model is ``QuickStartLm`` in Llama's layout (RMSNorm, gated SiLU two thirds as wide, no
embedding scale: the quick start's own LayerNorm and GELU match no Hugging Face family),
trained by ``pax train`` in a fresh process and exported by ``pax export --format hf``. Eight
prompts each get exactly ``NEW_TOKENS`` greedy tokens (no stop token), 8 at once and one at a
time. The hand-written loop calls the decoder as its tests do, none of the engine's code: a
jitted prefill of the prompts right-padded to the longest (each row's cache index set back to
its length), then argmax steps, one jitted step (its cache donated) a Python iteration or all
of them in one jitted ``jax.lax.fori_loop``; it must draw the engine's tokens exactly.
transformers runs the exported folder in float32, the prompts left-padded with their attention
mask; its tokens are compared with the engine's. torch gets as many threads as JAX has cores.

Compilation is excluded (a warm-up round first); ``--rounds`` rounds then run every variant in
turn, the order rotated each round, and the table reports medians: the machine is shared, so
the ratios, measured together, mean more than the absolute figures. A second table times one
decode step of each kind, to show where the engine's time goes.

    .nox/hf/bin/python bench/decode_speed.py [--steps N] [--rounds R] [--work DIR]

(the ``hf`` nox environment: torch and transformers beside editable installs of this
checkout). Writes bench/results/decode_speed.{json,md}.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import report

DEFAULT_STEPS = 300  # of the quick start's 600: decoding speed does not need a better model
NEW_TOKENS = 100
LLAMA = ["NORMALIZATION='rmsnorm'", "ACTIVATION='silu'", "USE_GATED_ACTIVATION=True",
         "SCALE_EMBEDDING=False", "HIDDEN_DIMS=512"]
PROMPTS = ["In the beginning", "And the LORD said unto", "Blessed are the meek",
           "Let there be light", "And it came to pass", "Thou shalt not covet",
           "The earth was without", "He that hath ears to"]
THREADS = len(os.sched_getaffinity(0))  # the cores XLA's CPU thread pool is sized by
# Before torch loads OpenMP: its threads' spinning waits stall torch on a shared machine whose
# other work holds the cores (each of its many small operations waits for a preempted thread).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

Runner = Callable[[list[list[int]]], list[list[int]]]  # prompts -> their new tokens


def pax(*args: str) -> dict[str, Any]:
    """Run ``pax ARGS`` in a fresh process; its command and seconds."""
    command = [str(Path(sys.executable).with_name("pax")), *args]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} failed:\n{done.stdout[-3000:]}"
                         f"{done.stderr[-3000:]}")
    return {"command": shlex.join(command), "seconds": round(time.perf_counter() - started, 1)}


def restore(job: Path) -> tuple[Any, dict[str, Any], Any]:
    """The job's decoder, its variables and the tokenizer, as ``pax decode`` restores them."""
    from pax_core import restore_latest
    from pax_core.plugins.host import PluginHost

    run, state, _ = restore_latest(PluginHost(), exp=None, plugin=None, set_items=[],
                                   job_dir=str(job))
    variables = {name: collection["decoder"] for name, collection
                 in run.eval_variables(state).items() if "decoder" in collection}
    return run.task.model.decoder, variables, run.train_input.tokenizer


def programs(decoder: Any, variables: dict[str, Any], batch: int, sampled: bool = False
             ) -> dict[str, Any]:
    """The hand-written decode's jitted programs for ``batch`` rows: ``prefill`` (right-padded
    ids, lengths -> cache, first tokens), ``step`` (cache, tokens -> cache, next tokens; the
    cache donated, so updated in place) and ``fused`` (ids, lengths -> every new token, in one
    ``fori_loop``). Greedy by argmax; by ``pax_lm.decoding.sample`` at temperature 0 (the
    engine's draw) when ``sampled``, for the step timings."""
    import jax
    import jax.numpy as jnp

    from pax_lm.decoding import sample

    empty = decoder.init(jax.random.key(0), jnp.zeros((batch, 1), jnp.int32),
                         decode=True)["cache"]

    def pick(logits: jax.Array, index: jax.Array) -> jax.Array:
        if not sampled:
            return jnp.argmax(logits, -1).astype(jnp.int32)
        zero = jnp.minimum(index, 0)  # zeros the compiler cannot fold, as the engine's
        return sample(logits, zero.astype(jnp.uint32), index, zero.astype(jnp.float32), zero,
                      zero + 1.0)

    def step(cache: Any, tokens: jax.Array) -> tuple[Any, jax.Array]:
        logits, mutated = decoder.apply({**variables, "cache": cache}, tokens[:, None],
                                        decode=True, mutable=["cache"])
        return mutated["cache"], pick(logits[:, 0], mutated["cache"]["index"])

    def prefill(ids: jax.Array, lengths: jax.Array) -> tuple[Any, jax.Array]:
        logits, mutated = decoder.apply({**variables, "cache": empty}, ids, decode=True,
                                        mutable=["cache"])
        cache = {**mutated["cache"], "index": lengths}  # right padding: back to each length
        return cache, pick(logits[jnp.arange(batch), lengths - 1], lengths)

    def fused(ids: jax.Array, lengths: jax.Array) -> jax.Array:
        cache, first = prefill(ids, lengths)

        def body(i: jax.Array, carry: tuple[Any, jax.Array]) -> tuple[Any, jax.Array]:
            cache, out = carry
            cache, token = step(cache, jax.lax.dynamic_index_in_dim(out, i - 1, 1, False))
            return cache, jax.lax.dynamic_update_index_in_dim(out, token, i, 1)

        out = jnp.zeros((batch, NEW_TOKENS), jnp.int32).at[:, 0].set(first)
        return jax.lax.fori_loop(1, NEW_TOKENS, body, (cache, out))[1]

    return {"prefill": jax.jit(prefill), "step": jax.jit(step, donate_argnums=0),
            "fused": jax.jit(fused)}


def padded(prompts: list[list[int]], batch: int) -> list[tuple[Any, Any]]:
    """(ids, lengths) of each group of ``batch`` prompts, right-padded to the longest prompt
    of all (one shape, one compilation)."""
    import numpy as np

    width, groups = max(map(len, prompts)), []
    for start in range(0, len(prompts), batch):
        group = prompts[start:start + batch]
        ids = np.zeros((batch, width), np.int32)
        for row, prompt in enumerate(group):
            ids[row, :len(prompt)] = prompt
        groups.append((ids, np.asarray([len(p) for p in group], np.int32)))
    return groups


def loop_runner(decoder: Any, variables: dict[str, Any], batch: int, fused: bool) -> Runner:
    """The hand-written decode: a jitted step a Python iteration (the tokens stay on the
    device until the end), or one jitted ``fori_loop`` when ``fused``."""
    import jax.numpy as jnp
    import numpy as np

    jitted = programs(decoder, variables, batch)

    def decode(ids: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
        if fused:
            return np.asarray(jitted["fused"](ids, lengths)).tolist()
        cache, token = jitted["prefill"](ids, lengths)
        tokens = [token]
        for _ in range(NEW_TOKENS - 1):
            cache, token = jitted["step"](cache, token)
            tokens.append(token)
        return np.asarray(jnp.stack(tokens, 1)).tolist()

    return lambda prompts: [row for group in padded(prompts, batch) for row in decode(*group)]


def hf_runner(folder: Path, batch: int) -> Runner:
    """transformers' greedy ``generate``, ``batch`` prompts a call (left-padded)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(THREADS)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # exactly NEW_TOKENS, as the others

    def run(prompts: list[list[int]]) -> list[list[int]]:
        found = []
        for group in (prompts[i:i + batch] for i in range(0, len(prompts), batch)):
            width = max(map(len, group))
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in group])
            ids = torch.tensor([[0] * (width - len(p)) + p for p in group])
            with torch.inference_mode():
                out = model.generate(ids, attention_mask=mask, max_new_tokens=NEW_TOKENS,
                                     do_sample=False, use_cache=True, pad_token_id=0)
            assert out.shape[1] == width + NEW_TOKENS, out.shape
            found.extend(out[:, width:].tolist())
        return found

    return run


def mismatches(found: list[list[int]], reference: list[list[int]]) -> dict[str, Any]:
    """Prompts whose tokens are all the engine's, tokens that differ, and where each prompt's
    first differs (None: nowhere)."""
    pairs = [list(zip(f, r, strict=True)) for f, r in zip(found, reference, strict=True)]
    first = [next((i for i, (a, b) in enumerate(row) if a != b), None) for row in pairs]
    return {"identical_prompts": first.count(None), "first_difference": first,
            "differing_tokens": sum(a != b for row in pairs for a, b in row)}


def interleaved(variants: dict[str, Callable[[], Any]], rounds: int
                ) -> dict[str, list[float]]:
    """The seconds of each variant in ``rounds`` rounds that run them all, the order rotated
    each round: the shared machine's busy spells fall on all alike, and two variants' times
    in one round (seconds apart) compare under the same load."""
    names, seconds = list(variants), {name: [] for name in variants}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            started = time.perf_counter()
            variants[name]()
            seconds[name].append(time.perf_counter() - started)
    return seconds


def quartiles(values: list[float]) -> list[float]:
    return [round(q, 3) for q in statistics.quantiles(values, n=4, method="inclusive")]


def measure(decoder: Any, variables: dict[str, Any], tokenizer: Any, folder: Path,
            prompts: list[list[int]], rounds: int) -> dict[str, Any]:
    """Tokens/s of every variant at batch 8 and 1 (medians), the engine's against each (the
    quartiles of the rounds' ratios), and transformers' tokens against the engine's; the
    hand-written loops must draw the engine's exactly."""
    from pax_lm.decoding import SamplingSettings
    from pax_lm.inference import Batcher, Engine, Request

    def engine_runner(engine: Engine) -> Runner:  # a Batcher a call, as pax decode makes one
        return lambda prompts: [done.tokens for done in Batcher(engine, tokenizer.decode).run(
            Request(p, SamplingSettings(NEW_TOKENS)) for p in prompts)]

    runners, engines = {}, {b: Engine(decoder, variables, b) for b in (8, 1)}
    for b in (8, 1):  # each engine built once, as a server holds it
        runners |= {f"engine/{b}": engine_runner(engines[b]),
                    f"python_loop/{b}": loop_runner(decoder, variables, b, fused=False),
                    f"fori_loop/{b}": loop_runner(decoder, variables, b, fused=True),
                    f"transformers/{b}": hf_runner(folder, b)}
    tokens = {name: run(prompts) for name, run in runners.items()}  # the warm-up: compiles
    reference = tokens["engine/8"]
    for name, found in tokens.items():
        if not name.startswith("transformers") and found != reference:
            raise SystemExit(f"{name} drew other tokens than the engine at batch 8: "
                             f"{mismatches(found, reference)}")
    seconds: dict[str, list[float]] = {}
    for b in (8, 1):  # a batch size's variants together: a round takes seconds, not minutes
        seconds |= interleaved({n: partial(run, prompts) for n, run in runners.items()
                                if n.endswith(f"/{b}")}, rounds)
    return {"tokens_per_s": {n: round(len(prompts) * NEW_TOKENS / statistics.median(s), 1)
                             for n, s in seconds.items()},
            "engine_over_this": {n: quartiles([t / e for t, e in zip(
                s, seconds["engine/" + n.split("/")[1]], strict=True)])
                for n, s in seconds.items()},
            "seconds": {n: [round(x, 4) for x in s] for n, s in seconds.items()},
            "transformers_vs_engine": {n: mismatches(tokens[n], reference)
                                       for n in runners if n.startswith("transformers")},
            "steps_per_call": engines[8].steps_per_call}


def step_costs(decoder: Any, variables: dict[str, Any], tokenizer: Any,
               prompts: list[list[int]], batch: int, rounds: int) -> dict[str, float]:
    """Milliseconds a decode step, every row busy (medians over rounds of NEW_TOKENS - 1
    steps): the engine's ``generate`` against the hand-written step, its tokens left on the
    device or read back each step, drawn by argmax or by the engine's ``sample``, and the
    differences between them (medians of each round's); and ``Batcher``'s own Python a
    ``step`` (under cProfile: an upper bound)."""
    import numpy as np

    from pax_lm.decoding import SamplingSettings
    from pax_lm.inference import Batcher, Engine, Request

    # One step a call, to compare the engine's step with the hand-written one.
    settings = SamplingSettings(NEW_TOKENS)
    engine = Engine(decoder, variables, batch, steps_per_call=1)
    prefilled = engine.prefill(prompts[:batch], [settings] * batch)
    argmax, sampled = (programs(decoder, variables, batch, s) for s in (False, True))
    [(ids, lengths), *_] = padded(prompts, batch)

    def engine_steps() -> None:
        slots = engine.insert(prefilled)
        for _ in range(NEW_TOKENS - 1):
            engine.generate()
        for slot in slots:
            engine.free(slot)

    def loop(jitted: dict[str, Any], read: bool) -> None:
        cache, token = jitted["prefill"](ids, lengths)
        for _ in range(NEW_TOKENS - 1):
            cache, token = jitted["step"](cache, token)
            if read:
                np.asarray(token)
        np.asarray(token)

    variants = {"engine_generate": engine_steps, "argmax_on_device": partial(loop, argmax, False),
                "argmax_read": partial(loop, argmax, True),
                "sample_read": partial(loop, sampled, True)}
    for variant in variants.values():
        variant()  # compiles
    seconds = interleaved(variants, rounds)
    found = {n: round(1e3 * statistics.median(s) / (NEW_TOKENS - 1), 3)
             for n, s in seconds.items()}
    found["differences"] = {what: round(1e3 * statistics.median(
        x - y for x, y in zip(seconds[a], seconds[b], strict=True)) / (NEW_TOKENS - 1), 3)
        for what, a, b in (("read", "argmax_read", "argmax_on_device"),
                           ("sample", "sample_read", "argmax_read"),
                           ("rest", "engine_generate", "sample_read"))}
    profile = cProfile.Profile()
    profile.runcall(lambda: list(Batcher(engine, tokenizer.decode).run(
        Request(p, settings) for p in prompts)))
    python = sum(tt for (file, *_), (_, _, tt, *_) in pstats.Stats(profile).stats.items()
                 if file.endswith(os.path.join("inference", "batching.py")))
    return {**found, "batcher_python": round(1e3 * python * batch / len(prompts) / NEW_TOKENS,
                                             3)}


ROWS = {"engine": "Pax engine (`Batcher` over `Engine`)",
        "python_loop": "hand-written JAX: jitted step in a Python loop",
        "fori_loop": "hand-written JAX: one jitted `fori_loop`",
        "transformers": "transformers `generate` (torch)"}
STEPS = {"engine_generate": "`Engine.generate()`, one step a call",
         "argmax_on_device": "hand-written step, argmax, tokens left on the device",
         "argmax_read": "hand-written step, argmax, tokens read each step",
         "sample_read": "hand-written step, the engine's `sample`, tokens read each step",
         "batcher_python": "`Batcher.step`'s own Python (cProfile)"}


def table(result: dict[str, Any]) -> str:
    speed, steps = result["tokens_per_s"], result["step_ms"]
    lines = [f"# Greedy decoding on {THREADS} CPU cores: Pax's engine, a hand-written JAX "
             f"loop, transformers", "",
             "| tokens/s (engine / this: median, quartiles) | batch 8 | batch 1 |",
             "|---|---:|---:|"]
    lines += [f"| {label} | " + " | ".join(
        f"{speed[f'{key}/{b}']:,.0f}" + ("" if key == "engine" else
                                         f" ({q[1]:.2f}, {q[0]:.2f}-{q[2]:.2f})")
        for b in (8, 1) for q in [result["engine_over_this"][f"{key}/{b}"]]) + " |"
        for key, label in ROWS.items()]
    lines += ["", "| ms a decode step, every row busy | batch 8 | batch 1 |", "|---|---:|---:|"]
    lines += [f"| {label} | {steps['8'][k]:.3f} | {steps['1'][k]:.3f} |"
              for k, label in STEPS.items()]
    compared = "; ".join(
        f"batch {name[-1]}: {c['identical_prompts']} of {len(PROMPTS)} prompts identical, "
        f"{c['differing_tokens']} of {len(PROMPTS) * NEW_TOKENS} tokens differ"
        for name, c in result["transformers_vs_engine"].items())
    parts = "; ".join(
        f"batch {b}: reading the tokens back each step {d['read']:+.3f}, drawing by "
        f"`sample` {d['sample']:+.3f}, the rest {d['rest']:+.3f}"
        for b, d in ((b, s["differences"]) for b, s in steps.items()))
    lines += [
        "", f"{len(PROMPTS)} prompts of {min(result['prompt_tokens'])} to "
        f"{max(result['prompt_tokens'])} tokens, {NEW_TOKENS} greedy tokens each, no stop "
        f"token; `QuickStartLm` in Llama's layout ({result['parameters']:,} parameters, "
        f"{result['training']['steps']} training steps; float32). Medians of "
        f"{result['rounds']} rounds (step timings: {3 * result['rounds']}) running every "
        f"variant of a batch size in turn, the order rotated, compilation excluded; a ratio's "
        f"median and quartiles are those of each round's ratio: on this shared machine "
        f"the ratios mean more than the absolute figures. JAX on {THREADS} cores, torch on "
        f"{THREADS} threads (OMP_WAIT_POLICY={result['omp_wait_policy']}). The hand-written "
        f"loops drew exactly the engine's tokens; transformers: {compared}.",
        "", f"The engine's step against the hand-written one, in ms (medians of each round's "
        f"difference; {parts}). `Engine.generate()` reads its step's tokens back at once; the "
        f"`Batcher` reads a call's tokens while the next call runs (one call ahead), so in "
        f"the tokens/s above that cost overlaps the computing, and the engine it drives takes "
        f"{result['steps_per_call']} steps a call (a scan), paying a call's dispatch once for "
        f"them. Target: the engine at 0.95 of the hand-written loop or better."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--work", type=Path, help="Where the job and its export go (default: "
                        "a temporary folder, removed after).")
    args = parser.parse_args()
    import jax

    with tempfile.TemporaryDirectory() as scratch:
        job, folder = (args.work or Path(scratch)) / "job", (args.work or Path(scratch)) / "hf"
        warmup = max(1, args.steps * 50 // 600)  # the quick start's 50 of 600 steps, scaled
        sets = [*LLAMA, f"NUM_TRAIN_STEPS={args.steps}", f"LR_COS_WARMUP={warmup}",
                f"LR_COS_DECAY_START={warmup}", f"LR_COS_DECAY_END={args.steps}",
                f"EVAL_INTERVAL_STEPS={args.steps}", f"CHECKPOINT_EVERY_N_STEPS={args.steps}"]
        training = {"steps": args.steps, **pax(
            "train", "--plugin", "lm", "--exp", "QuickStartLm", "--job-dir", str(job),
            *(a for s in sets for a in ("--set", s))),
            "export": pax("export", "--job-dir", str(job), "--format", "hf", "--output",
                          str(folder))["command"]}
        decoder, variables, tokenizer = restore(job)
        prompts = [[tokenizer.bos_id, *tokenizer.encode(text)] for text in PROMPTS]
        result = {"training": training, "prompt_tokens": [len(p) for p in prompts],
                  "new_tokens": NEW_TOKENS, "rounds": args.rounds, "threads": THREADS,
                  "omp_wait_policy": os.environ["OMP_WAIT_POLICY"],
                  "parameters": sum(x.size for x in jax.tree.leaves(variables["params"])),
                  **measure(decoder, variables, tokenizer, folder, prompts, args.rounds)}
    result["step_ms"] = {str(b): step_costs(decoder, variables, tokenizer, prompts, b,
                                            3 * args.rounds) for b in (8, 1)}
    report.save("decode_speed", result, table(result))


if __name__ == "__main__":
    main()
