"""``pax import hf`` of a checkpoint of about 1 GB: its peak resident memory against the
checkpoint's size, and its time.

The checkpoint is a bfloat16 Hugging Face folder of Qwen 2.5 0.5B's shapes (494M weights in
two safetensors shards, random values, a small tokenizer), written here with ``safetensors``
itself. ``pax import hf`` runs as a fresh process, as a user runs it; its peak resident memory
is the kernel's high-water mark for that process alone (its rusage from ``wait4``). The
checkpoint is written by a child of its own first, so this process stays small: a child's mark
starts from the size of the process it was forked from. The import holds a few tensors at a
time (the weights stream into the step through Orbax's partial saving, 64 MiB at a time,
uncopied), so its peak is JAX's own footprint plus about the largest tensor (the 272 MB
embedding), not the model.

    python bench/import_memory.py [--rounds 3]

Writes bench/results/import_memory.{json,md}. Linux (``ru_maxrss`` in KiB).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import report

MIB = 2**20
# Qwen 2.5 0.5B's configuration (its published config.json, trimmed to what shapes need).
CONFIG = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896,
          "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
          "num_key_value_heads": 2, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
          "max_position_embeddings": 32768, "tie_word_embeddings": True, "hidden_act": "silu",
          "torch_dtype": "bfloat16"}


def _shapes() -> dict[str, tuple[int, ...]]:
    d, f, v = CONFIG["hidden_size"], CONFIG["intermediate_size"], CONFIG["vocab_size"]
    kv = CONFIG["num_key_value_heads"] * d // CONFIG["num_attention_heads"]
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,)}
    for i in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{i}"
        shapes.update({
            f"{p}.input_layernorm.weight": (d,), f"{p}.post_attention_layernorm.weight": (d,),
            f"{p}.self_attn.q_proj.weight": (d, d), f"{p}.self_attn.q_proj.bias": (d,),
            f"{p}.self_attn.k_proj.weight": (kv, d), f"{p}.self_attn.k_proj.bias": (kv,),
            f"{p}.self_attn.v_proj.weight": (kv, d), f"{p}.self_attn.v_proj.bias": (kv,),
            f"{p}.self_attn.o_proj.weight": (d, d), f"{p}.mlp.gate_proj.weight": (f, d),
            f"{p}.mlp.up_proj.weight": (f, d), f"{p}.mlp.down_proj.weight": (d, f)})
    return shapes


def write_folder(folder: Path) -> int:
    """The checkpoint, in two shards with their index; returns the weights' bytes."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    names = list(_shapes().items())
    halves = [names[: len(names) // 2], names[len(names) // 2:]]
    weight_map, total = {}, 0
    for number, half in enumerate(halves, start=1):
        shard = f"model-{number:05d}-of-00002.safetensors"
        tensors = {n: (rng.standard_normal(s, np.float32) * 0.02).astype(ml_dtypes.bfloat16)
                   for n, s in half}
        save_file(tensors, str(folder / shard), metadata={"format": "pt"})
        total += sum(t.nbytes for t in tensors.values())
        weight_map.update(dict.fromkeys(tensors, shard))
        del tensors
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}))
    (folder / "config.json").write_text(json.dumps(CONFIG))
    _tokenizer(folder)
    return total


def _tokenizer(folder: Path) -> None:
    import tokenizers

    words = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(997)]
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>")
    tokenizers.Tokenizer(model).save(str(folder / "tokenizer.json"))


def measure(folder: Path, job: Path) -> dict[str, float]:
    """One ``pax import hf`` in a fresh process: seconds and its peak resident MiB (its own
    rusage, from ``wait4``)."""
    pax = str(Path(sys.executable).with_name("pax"))
    with tempfile.TemporaryFile() as errors:
        started = time.perf_counter()
        process = subprocess.Popen([pax, "import", "hf", str(folder), "--output", str(job)],
                                   stdout=subprocess.DEVNULL, stderr=errors)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        if process.returncode != 0:
            errors.seek(0)
            raise SystemExit(f"pax import failed: {errors.read().decode()}")
    return {"seconds": seconds, "peak_mib": usage.ru_maxrss * 1024 / MIB}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", metavar="FOLDER", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write:
        folder = Path(args.write)
        (folder / "weights_bytes").write_text(str(write_folder(folder)))
        return
    with tempfile.TemporaryDirectory(prefix="pax-import-bench-") as tmp:
        folder = Path(tmp) / "qwen"
        folder.mkdir()
        # Written by a process of its own: a child's high-water mark starts from the size of
        # the process that forked it, which must stay small.
        subprocess.run([sys.executable, __file__, "--write", str(folder)], check=True)
        weights = int((folder / "weights_bytes").read_text())
        runs = []
        for i in range(args.rounds):
            job = Path(tmp) / f"job{i}"
            runs.append(measure(folder, job))
            shutil.rmtree(job)
            print(f"round {i + 1}: {runs[-1]['seconds']:.1f} s, peak {runs[-1]['peak_mib']:.0f} "
                  f"MiB", flush=True)
    peak = max(r["peak_mib"] for r in runs)
    seconds = statistics.median(r["seconds"] for r in runs)
    size = weights / MIB
    data = {"weights_mib": size, "params": sum(int(np.prod(s)) for s in _shapes().values()),
            "peak_mib": peak, "peak_over_size": peak / size, "seconds_median": seconds,
            "runs": runs}
    table = (f"# `pax import hf` of a {size:.0f} MiB checkpoint (Qwen 2.5 0.5B's shapes, "
             f"bfloat16)\n\n"
             f"| weights (MiB) | parameters | peak resident (MiB) | peak / weights | "
             f"seconds (median of {args.rounds}) |\n|---:|---:|---:|---:|---:|\n"
             f"| {size:.0f} | {data['params']:,} | {peak:.0f} | {peak / size:.2f} | "
             f"{seconds:.1f} |\n")
    report.save("import_memory", data, table)


if __name__ == "__main__":
    main()
