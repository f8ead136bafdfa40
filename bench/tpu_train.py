"""`pax train` on one TPU v5e chip against a hand-written JAX loop (bench/tpu_loop.py), and the
checks that only the chip can make, as one script run there.

Steps (``--steps``, each a name; all by default):

* ``start``: `pax train` and `pax decode` of the LM quick start with no flags, as a new user
  runs them on a one-host TPU VM (no metadata server there).
* ``parity``: Splash (the tpu backend's attention) against XLA's attention at the benchmark's
  shape, values and gradients in float32 at the highest matmul precision.
* ``pax-MODEL-POLICY``: `pax train` of ``LlamaBench470M`` (``470m``) or ``LlamaBench1B``
  (``1b``) with that ``CHECKPOINT_POLICY``: tokens/s (the median of the summaries after the
  first), MFU, HFU and the device memory peak as the run logs them (``POLICY+int8``: trained
  with ``QUANTIZE_TRAINING='int8'``); then the compiled step's
  own figures (FLOPs with loops counted in full, as ``pax plan`` reads the program; the memory
  the compiler plans) for the HFU and peak to be checked against.
* ``hand-MODEL-POLICY``: bench/tpu_loop.py at that remat policy (full, dots, qkv_out,
  qkv_attn_out, attn_out, none).
* ``profile-MODEL-POLICY``: three steps of each traced with ``jax.profiler``, Pax at that
  ``CHECKPOINT_POLICY`` and the hand-written loop at the policy saving the same
  (``HAND_POLICY``; qkv_out for any other, ``auto`` included; ``POLICY+int8``: Pax trained
  in int8, the loop in bfloat16), the traces copied to
  ``--out``/{pax,hand}-MODEL.xplane.pb for bench/tpu_profile.py to read.
* ``rotary``: rotary positions written three ways (Pax's ``apply_rotary``; one pass over
  whole heads whose backward pass is the rotation back; the half swap as a product with a
  signed permutation), each between the 470M benchmark's query and key projections and Splash,
  forward and backward timed.
* ``splash``: Splash's forward and backward at the 470M benchmark's attention ([8, 16, 2,048,
  64] in bfloat16, causal) for several tilings, and a projection-sized matmul for scale.

Each step appends one JSON line to ``--out``/tpu_train.jsonl. Run here, ``--report FILE...``
turns such files into bench/results/tpu_train.{json,md} (the ratios: Pax's tokens/s over the
hand-written loop's best). ``--commit`` names the commit measured: the chip's copy of the
checkout has no git.

    python bench/tpu_train.py --commit C --out DIR [--steps start,parity,pax-470m-auto,...]
    python bench/tpu_train.py --report DIR/tpu_train.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
EXPERIMENTS = {"470m": "LlamaBench470M", "1b": "LlamaBench1B"}
DEFAULT_STEPS = ("start", "parity", "pax-470m-auto", "pax-470m-auto+int8", "hand-470m-attn_out",
                 "hand-470m-qkv_attn_out", "hand-470m-qkv_out", "pax-1b-auto", "hand-1b-full",
                 "hand-1b-attn_out")


# The hand-written loop's policy that saves what a Pax policy saves (``profile`` traces both):
# the attention kernel's residuals and the output projection, the three projections and the
# output projection, nothing.
HAND_POLICY = {"SAVE_CONTEXT_AND_OUT_PROJ": "attn_out", "SAVE_QKV_OUT_PROJ": "qkv_out",
               "SAVE_NOTHING": "full"}


def _pax(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["pax", *args], capture_output=True, text=True, timeout=timeout)


def start(work: Path) -> dict:
    job = work / "quickstart"
    began = time.perf_counter()
    trained = _pax("train", "--plugin", "lm", "--exp", "QuickStartLm", "--job-dir", str(job),
                   "--set", "NUM_TRAIN_STEPS=20", "--set", "EVAL_INTERVAL_STEPS=20")
    decoded = _pax("decode", "--plugin", "lm", "--job-dir", str(job), "--prompt",
                   "And God said", "--max-decode-steps", "20")
    return {"step": "start", "train_exit": trained.returncode, "decode_exit": decoded.returncode,
            "train_tail": trained.stderr.strip().splitlines()[-3:],
            "decoded": decoded.stdout.strip()[-200:], "decode_tail": decoded.stderr[-400:],
            "sec": time.perf_counter() - began,
            "splash_fallbacks": [line for line in trained.stderr.splitlines()
                                 if "not Splash" in line]}


def parity() -> dict:
    import jax
    import jax.numpy as jnp

    from pax_core.backends.base import Backend
    from pax_core.backends.splash import splash_attention

    jax.config.update("jax_default_matmul_precision", "highest")
    keys = jax.random.split(jax.random.key(0), 4)
    shape = (2, 2048, 16, 64)
    q, k, v = (jax.random.normal(key, shape) for key in keys[:3])
    weight = jax.random.normal(keys[3], shape)
    mask = jnp.tril(jnp.ones((2048, 2048), bool))[None, None]

    def splash(q, k, v):
        return splash_attention(q, k, v, is_causal=True, segment_ids=None)

    def xla(q, k, v):
        return Backend().attention(q, k, v, mask=mask, is_causal=True, segment_ids=None)

    def weighted(fn):
        return lambda q, k, v: (fn(q, k, v) * weight).sum()

    found = {name: (jax.jit(fn)(q, k, v),
                    jax.jit(jax.grad(weighted(fn), argnums=(0, 1, 2)))(q, k, v))
             for name, fn in (("splash", splash), ("xla", xla))}

    def error(a, b):
        return float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))

    (out, grads), (out_x, grads_x) = found["splash"], found["xla"]
    return {"step": "parity", "shape": shape, "output_rel_error": error(out, out_x),
            **{f"d{n}_rel_error": error(g, g_x)
               for n, g, g_x in zip("qkv", grads, grads_x, strict=True)}}


def _compiled_figures(experiment: str, overrides: list[str], hlo_file: Path | None) -> dict:
    """The compiled train step's own FLOPs (loops in full, ``pax plan``'s reading) and the
    memory the compiler plans for it, compiled (and fitted) as `pax train` compiles it."""
    from pax_core.config.resolve import choose_experiment
    from pax_core.plugins.host import PluginHost, PluginSelection
    from pax_core.run.fitting import build_fitted_run
    from pax_core.run.runtime import start_runtime
    from pax_core.speed import hlo
    from pax_core.speed.flops import hardware_flops

    host = PluginHost(PluginSelection.from_env())
    chosen = choose_experiment(host, experiment, "lm", overrides)
    runtime = start_runtime(host, None, chosen.experiment)
    run = build_fitted_run(host, chosen, None, runtime.devices, read_data=False)
    compiled = run.first_step or run.compile_train_step()
    text = compiled.as_text()
    if hlo_file is not None:
        hlo_file.write_text(text)
    memory = compiled.memory_analysis()
    costs = hlo.step_costs(text, run.partitioner.mesh.size)  # per device
    devices = run.partitioner.mesh.size
    return {"program_flops": sum(c.flops * c.executions for c in costs) * devices,
            "hfu_flops": hardware_flops(compiled, devices),
            "xla_flops_once": compiled.cost_analysis().get("flops"),
            "while_loops": text.count(" while("),
            "trip_count_notes": text.count("known_trip_count"),
            "custom_calls": text.count("custom-call("),
            "program_peak_gib": (memory.argument_size_in_bytes + memory.temp_size_in_bytes
                                 + memory.output_size_in_bytes - memory.alias_size_in_bytes)
            / 2**30,
            "memory_analysis_gib": _analysis_gib(memory),
            "fitted": run.fitted}


def _analysis_gib(memory) -> dict:
    """Every size the compiler's memory analysis gives, in GiB."""
    return {name: round(getattr(memory, name) / 2**30, 3) for name in dir(memory)
            if name.endswith("_in_bytes") and isinstance(getattr(memory, name), int)}


def _policy_overrides(policy: str, steps: int) -> list[str]:
    """The experiment's overrides for a step's ``POLICY`` (``CHECKPOINT_POLICY``, or
    ``CHECKPOINT_POLICY+int8``: trained with ``QUANTIZE_TRAINING='int8'``) and ``steps``."""
    remat, _, quantized = policy.partition("+")
    return [f"CHECKPOINT_POLICY={remat}", f"NUM_TRAIN_STEPS={steps}",
            *([f"QUANTIZE_TRAINING={quantized}"] if quantized else [])]


def _sets(overrides: list[str]) -> list[str]:
    return [a for o in overrides for a in ("--set", o)]


def pax_run(model: str, policy: str, work: Path, steps: int, hlo_dir: Path | None) -> dict:
    """``policy`` may end ``+int8`` (``_policy_overrides``)."""
    job = work / f"pax-{model}-{policy}"
    overrides = _policy_overrides(policy, steps)
    began = time.perf_counter()
    done = _pax("train", "--plugin", "lm", "--exp", EXPERIMENTS[model], "--job-dir", str(job),
                *_sets(overrides), "--no-eval-on-test")
    found = {"step": f"pax-{model}-{policy}",
             "exit": done.returncode,
             "sec": time.perf_counter() - began}
    if done.returncode:
        return {**found, "stderr": done.stderr[-1500:]}
    records = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("kind") == "train"][1:]
    start_record = next((r for r in records if r.get("kind") == "start"), {})
    found.update({name: statistics.median(r[name] for r in train) for name in
                  ("tokens_per_sec", "mfu", "hfu", "device_memory_peak_gib", "steps_per_sec")
                  if all(name in r for r in train)})
    found["hardware_flops_per_step"] = start_record.get("hardware_flops_per_step")
    found["fitted_in_run"] = start_record.get("fitted")
    found["loss"] = train[-1].get("loss") if train else None
    found["splash_fallbacks"] = [line for line in done.stderr.splitlines() if "not Splash" in line]
    hlo_file = hlo_dir / f"{found['step']}.hlo" if hlo_dir else None
    found.update(_compiled_figures(EXPERIMENTS[model], overrides, hlo_file))
    return found


def hand_run(model: str, policy: str, *extra: str) -> dict:
    done = subprocess.run([sys.executable, str(HERE / "tpu_loop.py"), "--model", model,
                           "--remat", policy, *extra], capture_output=True, text=True,
                          timeout=600)
    if done.returncode:
        return {"step": f"hand-{model}-{policy}", "exit": done.returncode,
                "stderr": done.stderr[-1500:]}
    return {"step": f"hand-{model}-{policy}", "exit": 0,
            **json.loads(done.stdout.strip().splitlines()[-1])}


def _newest_trace(folder: Path) -> Path:
    return max(folder.glob("**/*.xplane.pb"), key=lambda f: f.stat().st_mtime)


def profile(model: str, policy: str, work: Path, out: Path) -> dict:
    """Pax's step and the hand-written loop's, three of each traced."""
    job = work / f"profile-{model}"
    done = _pax("train", "--plugin", "lm", "--exp", EXPERIMENTS[model], "--job-dir", str(job),
                *_sets(_policy_overrides(policy, 12)), "--profile-steps", "10:12",
                "--no-eval-on-test")
    found = {"step": f"profile-{model}-{policy}", "pax_exit": done.returncode,
             "pax_tail": done.stderr[-800:]}
    if not done.returncode:
        (out / f"pax-{model}.xplane.pb").write_bytes(_newest_trace(job / "profile").read_bytes())
    hand = hand_run(model, HAND_POLICY.get(policy.partition("+")[0], "qkv_out"), "--steps", "5",
                    "--profile", str(work / "hand"))
    found["hand"] = hand
    if not hand["exit"]:
        (out / f"hand-{model}.xplane.pb").write_bytes(_newest_trace(work / "hand").read_bytes())
    return found


def _seconds(fn, *args, repeats: int = 10) -> float:
    """Median wall time of ``fn(*args)`` after a compile and a warm-up call."""
    import jax

    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def splash_tilings() -> dict:
    """Splash's forward + backward at the 470M benchmark's attention for several tilings."""
    import jax
    import jax.numpy as jnp
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    batch, heads, length, dims = 8, 16, 2048, 64
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(key, (batch, heads, length, dims), jnp.bfloat16)
               for key in keys)
    causal_flops = 4 * batch * heads * length * length * dims / 2  # QK and PV, half the mask
    tilings = {}
    for block, fused, kv_compute, layout in ((512, False, 512, "head"), (512, True, 512, "head"),
                                             (1024, True, 512, "head"),
                                             (1024, True, 1024, "head"),
                                             (2048, True, 512, "head"),
                                             (512, True, 512, "seq"), (1024, True, 512, "seq")):
        name = f"block{block}-kvc{kv_compute}-{'fused' if fused else 'split'}-k{layout}"
        dq = {} if fused else {"block_q_dq": block, "block_kv_dq": block}
        k_layout = (splash.QKVLayout.SEQ_MINOR if layout == "seq"
                    else splash.QKVLayout.HEAD_DIM_MINOR)
        try:
            sizes = splash.BlockSizes(
                block_q=block, block_kv=block, block_kv_compute=kv_compute, block_q_dkv=block,
                block_kv_dkv=block, block_kv_dkv_compute=kv_compute,
                use_fused_bwd_kernel=fused, k_layout=k_layout, **dq)
            kernel = jax.vmap(splash.make_splash_mha(
                splash.MultiHeadMask([splash.CausalMask((length, length))] * heads),
                block_sizes=sizes, head_shards=1, q_seq_shards=1))
            forward = jax.jit(kernel)
            both = jax.jit(jax.grad(lambda q, k, v, f=kernel: f(q, k, v).astype(jnp.float32).sum(),
                                    argnums=(0, 1, 2)))
            fwd, total = _seconds(forward, q, k, v), _seconds(both, q, k, v)
            tilings[name] = {"forward_ms": fwd * 1e3, "forward_and_backward_ms": total * 1e3,
                             "forward_tflops": causal_flops / fwd / 1e12,
                             "all_tflops": 3.5 * causal_flops / total / 1e12}
        except Exception as error:  # a tiling the kernel refuses is a finding
            tilings[name] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
    a = jax.random.normal(keys[0], (batch * length, 1024), jnp.bfloat16)
    b = jax.random.normal(keys[1], (1024, 4096), jnp.bfloat16)
    matmul = _seconds(jax.jit(lambda a, b: a @ b), a, b)
    return {"step": "splash", "shape": [batch, heads, length, dims], "tilings": tilings,
            "matmul_16384x1024x4096_tflops": 2 * batch * length * 1024 * 4096 / matmul / 1e12}


def _rotary_variants() -> dict:
    """Rotary written three ways, the same numbers each: x [B, T, N, H], angle [B, T, 1, H/2]."""
    import jax
    import jax.numpy as jnp

    def halves(sin, cos):
        return jnp.concatenate([cos, cos], -1), jnp.concatenate([-sin, sin], -1)

    def whole(x, angle):
        cos, sin = halves(jnp.sin(angle), jnp.cos(angle))
        half = angle.shape[-1]
        y = x.astype(jnp.float32)
        swapped = jnp.concatenate([y[..., half:], y[..., :half]], -1)
        return (y * cos + swapped * sin).astype(x.dtype)

    @jax.custom_vjp
    def turned(x, angle):
        return whole(x, angle)

    turned.defvjp(lambda x, angle: (whole(x, angle), angle),
                  lambda angle, g: (whole(g, -angle), jnp.zeros_like(angle)))

    def permuted(x, angle):
        half = angle.shape[-1]
        eye = jnp.eye(half, dtype=x.dtype)
        zero = jnp.zeros_like(eye)
        swap = jnp.block([[zero, eye], [-eye, zero]])  # x @ swap = [-x2, x1]
        swapped = jnp.einsum("...h,hk->...k", x, swap, preferred_element_type=jnp.float32,
                             precision=jax.lax.Precision.HIGHEST)
        cos = jnp.concatenate([jnp.cos(angle)] * 2, -1)
        sin = jnp.concatenate([jnp.sin(angle)] * 2, -1)
        return (x.astype(jnp.float32) * cos + swapped * sin).astype(x.dtype)

    return {"whole_custom_vjp": turned, "permutation_product": permuted}


def rotary_forms() -> dict:
    """Each rotary form between the 470M benchmark's projections and Splash, on the chip."""
    import jax
    import jax.numpy as jnp

    from pax_core.backends.splash import splash_attention
    from pax_transformer.layers.positions import apply_rotary, rotary_frequencies

    batch, length, heads, dims = 8, 2048, 16, 64
    keys = jax.random.split(jax.random.key(0), 4)
    x = jax.random.normal(keys[0], (batch, length, heads * dims), jnp.bfloat16)
    weights = [jax.random.normal(k, (heads * dims, heads, dims), jnp.bfloat16) * 0.03
               for k in keys[1:]]
    positions = jnp.broadcast_to(jnp.arange(length), (batch, length))
    frequencies = rotary_frequencies(dims, 10000.0)
    angle = positions[:, :, None, None].astype(jnp.float32) * frequencies
    forms = {"pax": lambda t, a: apply_rotary(t, positions, frequencies=frequencies),
             **_rotary_variants()}

    def loss(weights, form):
        q, k, v = (jnp.einsum("btd,dnh->btnh", x, w) for w in weights)
        q, k = form(q, angle), form(k, angle)
        out = splash_attention(q, k, v, is_causal=True, segment_ids=None)
        return out.astype(jnp.float32).sum()

    found, reference = {}, None
    for name, form in forms.items():
        step = jax.jit(jax.grad(lambda w, f=form: loss(w, f)))
        grads = step(weights)
        reference = grads if reference is None else reference
        found[name] = {"forward_and_backward_ms": _seconds(step, weights) * 1e3,
                       "max_grad_difference_from_pax": float(max(
                           jnp.max(jnp.abs(g.astype(jnp.float32) - r.astype(jnp.float32)))
                           for g, r in zip(grads, reference, strict=True)))}
    return {"step": "rotary", "shape": [batch, length, heads, dims], "forms": found}


def measure(args: argparse.Namespace) -> None:
    """Each step in a process of its own: one process at a time can hold the chip."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.steps.split(",")
    if len(names) > 1:
        for name in names:
            subprocess.run([sys.executable, __file__, *sys.argv[1:], "--steps", name])
        return
    with tempfile.TemporaryDirectory() as tmp:
        kind, _, rest = names[0].partition("-")
        model, _, policy = rest.partition("-")
        if kind == "start":
            result = start(Path(tmp))
        elif kind == "parity":
            result = parity()
        elif kind == "splash":
            result = splash_tilings()
        elif kind == "rotary":
            result = rotary_forms()
        elif kind == "profile":
            result = profile(model, policy, Path(tmp), out)
        elif kind == "pax":
            result = pax_run(model, policy, Path(tmp), args.train_steps,
                             Path(args.hlo_dir) if args.hlo_dir else None)
        else:
            result = hand_run(model, policy)
    result["commit"] = args.commit
    print(json.dumps(result), flush=True)
    with open(out / "tpu_train.jsonl", "a") as f:
        f.write(json.dumps(result) + "\n")


def write_report(files: list[Path]) -> None:
    """bench/results/tpu_train.{json,md} from the JSON lines the chip wrote."""
    import report

    rows = [json.loads(line) for f in files for line in f.read_text().splitlines() if line]
    rows = [r for r in rows if r.get("exit", 0) == 0 or r["step"] in ("start",)]
    speed = [r for r in rows if r["step"].startswith(("pax-", "hand-"))]
    lines = ["| run | remat | tokens/s | MFU | HFU | HFU's FLOPs / program's | memory GiB "
             "logged | compiler's peak GiB | commit |", "|---|---|---|---|---|---|---|---|---|"]
    for r in speed:
        remat = (r.get("fitted_in_run") or [r["step"].split("-", 2)[2]])[0]
        remat = remat.split(" chose ")[1].split(" for ")[0] if " chose " in remat else remat
        agree = (f"{r['hfu_flops'] / r['program_flops']:.4f}" if r.get("program_flops")
                 else "")
        hfu = f"{r['hfu']:.3f}" if "hfu" in r else ""
        peak = r.get("memory_analysis_gib", {}).get("peak_memory_in_bytes")
        run = r["step"].rsplit("-", 1)[0] + (" int8" if r["step"].endswith("+int8") else "")
        lines.append(f"| {run} | {remat} | {r['tokens_per_sec']:,.0f} | "
                     f"{r['mfu']:.3f} | {hfu} | {agree} | {r['device_memory_peak_gib']:.2f} | "
                     f"{'' if peak is None else f'{peak:.2f}'} | {r['commit']} |")
    lines.append(
        "\nHFU and memory as each commit logged them: before 749f4cd HFU counted the TPU's "
        "convolution-written products by every tap of their padded windows (16x a projection's "
        "work). In every row the logged memory adds a step's temporaries whole to what is in "
        "use, more than the TPU compiler's own peak (the last column): the commit after "
        "1458c22 logs that peak, and auto fits by it from 1458c22 on (66f98d6 fitted by "
        "arguments and temporaries, and so passed over SAVE_QKV_OUT_PROJ). Memory GiB of the "
        "hand-written loop: what is in use plus its temporaries.")
    ratios = {}
    for model in EXPERIMENTS:
        pax = [r for r in speed if r["step"].startswith(f"pax-{model}-") and "+" not in r["step"]]
        int8 = [r for r in speed if r["step"].startswith(f"pax-{model}-") and "+int8" in r["step"]]
        float_rows = [r for r in pax if int8 and r["commit"] == int8[-1]["commit"]]
        if float_rows:
            lines.append(f"\n{EXPERIMENTS[model]}: int8 training ({int8[-1]['commit']}) at "
                         f"{int8[-1]['tokens_per_sec'] / float_rows[-1]['tokens_per_sec']:.3f}x "
                         f"the tokens/s of bfloat16 ({float_rows[-1]['step']}).")
        hand = [r for r in speed if r["step"].startswith(f"hand-{model}-")]
        if pax and hand:
            best = max(hand, key=lambda r: r["tokens_per_sec"])
            newest = pax[-1]
            ratios[model] = newest["tokens_per_sec"] / best["tokens_per_sec"]
            lines.append(f"\n{EXPERIMENTS[model]}: Pax ({newest['commit']}) at "
                         f"{ratios[model]:.3f}x the tokens/s of the hand-written loop at its "
                         f"best remat ({best['step']}, {best['tokens_per_sec']:,.0f}).")
    if ratios:
        weakest = min(ratios, key=ratios.get)
        lines.append(f"\nWeakest ratio: {ratios[weakest]:.3f}x ({EXPERIMENTS[weakest]}).")
    for r in rows:
        if r["step"] == "parity":
            lines.append(f"\nSplash against XLA at {r['shape']} (float32, highest precision, "
                         f"{r['commit']}): output {r['output_rel_error']:.1e}, dq "
                         f"{r['dq_rel_error']:.1e}, dk {r['dk_rel_error']:.1e}, dv "
                         f"{r['dv_rel_error']:.1e} of the largest value.")
        if r["step"] == "splash":
            lines += [f"\nSplash's tilings at {r['shape']} (bfloat16, causal, {r['commit']}; a "
                      f"{r['matmul_16384x1024x4096_tflops']:.0f} TFLOP/s matmul for scale):", "",
                      "| tiling | forward ms | forward and backward ms | TFLOP/s (all) |",
                      "|---|---:|---:|---:|"]
            lines += [f"| {name} | {t['forward_ms']:.2f} | {t['forward_and_backward_ms']:.2f} | "
                      f"{t['all_tflops']:.1f} |" if "error" not in t else
                      f"| {name} | {t['error'][:60]} | | |" for name, t in r["tilings"].items()]
        if r["step"] == "rotary":
            lines += [f"\nRotary between projections and Splash at {r['shape']} ({r['commit']}):",
                      "", "| form | forward and backward ms | gradients' largest difference |",
                      "|---|---:|---:|"]
            lines += [f"| {name} | {f['forward_and_backward_ms']:.2f} | "
                      f"{f['max_grad_difference_from_pax']:.1e} |"
                      for name, f in r["forms"].items()]
        if r["step"] == "start":
            lines.append(f"\nNo flags on the one-host TPU VM ({r['commit']}): pax train exit "
                         f"{r['train_exit']}, pax decode exit {r['decode_exit']}.")
    lines.append("\nMeasured on one TPU v5e chip at the commit of each row (the chip's copy of "
                 "that commit's checkout), by `python bench/tpu_train.py --commit C --steps "
                 "...`; this table by `python bench/tpu_train.py --report "
                 "bench/data/tpu_train_runs.jsonl`.")
    report.save("tpu_train", {"commit": "each row's", "rows": rows, "ratios": ratios},
                "\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default=",".join(DEFAULT_STEPS))
    parser.add_argument("--commit", default="unknown")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--train-steps", type=int, default=40)
    parser.add_argument("--hlo-dir", help="where to write each Pax step's compiled HLO text")
    parser.add_argument("--report", nargs="*")
    args = parser.parse_args()
    if args.report:
        write_report([Path(p) for p in args.report])
    else:
        measure(args)


if __name__ == "__main__":
    main()
