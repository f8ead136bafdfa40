"""The GPU device check: a dense ~1.3B-parameter decoder LM trained in bfloat16 at sequence
length 2048 through what ``pax train`` runs (the gpu backend: NVIDIA's presets, cuDNN
attention), and one table of what it reached: tokens/s, step time, MFU against the device's
peak (pax_core's H100/H200 table), peak device memory. Target: MFU >= 0.45 on H100/H200.

    python bench/gpu/train_1b.py [--steps 40] [--batch-per-device 8] [--fp8] [--job-dir DIR]

``--fp8`` runs the blocks' projections in FP8 (``USE_FP8``: delayed scaling, e4m3/e5m2); MFU
stays measured against the bfloat16 peak, as MaxText and NVIDIA report FP8 runs.

Needs pax-core, pax-transformer, pax-lm and pax-gpu[cuda12] on a machine with NVIDIA GPUs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# LmCloudSpmd2B's family at 1.3B: 24 layers of width 2048, 16 heads of 128, GELU MLP 8192;
# no logit cap (a capped attention cannot run on cuDNN) and no rematerialisation (it fits).
MODEL = ["NUM_LAYERS=24", "MODEL_DIMS=2048", "HIDDEN_DIMS=8192", "NUM_HEADS=16",
         "DIMS_PER_HEAD=128", "MAX_SEQ_LEN=2048", "FPROP_DTYPE='bfloat16'",
         "ATTEN_LOGIT_CAP=0.0", "CHECKPOINT_POLICY='SAVE_EVERYTHING'"]
TARGET_MFU = 0.45


def gpus() -> list:
    """The GPUs JAX sees in a fresh process (empty when there are none)."""
    probe = ("import jax, json; print(json.dumps([[d.device_kind, d.id] "
             "for d in jax.devices() if d.platform == 'gpu']))")
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return json.loads(found.stdout.strip().splitlines()[-1]) if found.returncode == 0 else []


def train(job_dir: Path, devices: int, steps: int, batch: int, fp8: bool) -> int:
    """Train in this process (so the devices' memory statistics are this run's); returns the
    peak bytes in use on device 0."""
    from pax_core import testing

    sets = [*MODEL, f"ICI_MESH_SHAPE=[1,{devices},1]", f"PERCORE_BATCH_SIZE={batch}",
            f"NUM_TRAIN_STEPS={steps}", "SUMMARY_INTERVAL_STEPS=10",
            f"CHECKPOINT_EVERY_N_STEPS={steps}", "LOGGERS=('console', 'jsonl')",
            f"USE_FP8={fp8}"]
    testing.train(testing.PluginHost(), exp="LmCloudSpmd2B", plugin="lm", set_items=sets,
                  job_dir=str(job_dir), platform="gpu", evaluate=False)
    import jax

    return (jax.local_devices()[0].memory_stats() or {}).get("peak_bytes_in_use", 0)


def table(job_dir: Path, kinds: list, peak_bytes: int, fp8: bool) -> list[tuple[str, str]]:
    records = [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]
    start = next(r for r in records if r["kind"] == "start")
    last = [r for r in records if r["kind"] == "train"][-1]  # past compilation and warm-up
    rows = [("device", f"{len(kinds)} x {kinds[0][0]}"),
            ("parameters", f"{start['num_params']:,}"),
            ("global batch x sequence", f"{start['global_batch_size']} x 2048"),
            ("matmuls", "FP8 (e4m3/e5m2, delayed scaling)" if fp8 else "bfloat16"),
            ("tokens/s", f"{last['tokens_per_sec']:,.0f}"),
            ("step time (s)", f"{1 / last['steps_per_sec']:.3f}"),
            ("MFU", f"{last.get('mfu', float('nan')):.3f} (target {TARGET_MFU})"),
            ("HFU", f"{last.get('hfu', float('nan')):.3f}")]
    rows.append(("peak memory, device 0", f"{peak_bytes / 2**30:.1f} GiB"))
    rows += [("preset", line) for line in start.get("presets", [])]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-per-device", type=int, default=8)
    parser.add_argument("--fp8", action="store_true", help="the projections in FP8")
    parser.add_argument("--job-dir", type=Path, default=None)
    args = parser.parse_args()
    kinds = gpus()
    if not kinds:
        print("bench/gpu/train_1b.py: no NVIDIA GPU is visible to JAX here; run it on a GPU "
              "machine with pax-gpu[cuda12] installed", file=sys.stderr)
        return 2
    job_dir = args.job_dir or Path(tempfile.mkdtemp(prefix="pax-gpu-1b-")) / "job"
    from pax_core import UsageError

    try:
        peak_bytes = train(job_dir, len(kinds), args.steps, args.batch_per_device, args.fp8)
    except UsageError as e:  # what pax train refuses (FP8 before compute capability 8.9)
        print(f"bench/gpu/train_1b.py: {e}", file=sys.stderr)
        return 2
    rows = table(job_dir, kinds, peak_bytes, args.fp8)
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    out = os.environ.get("OUT")
    if out:
        record = {name: value for name, value in rows if name != "preset"}
        record["presets"] = [value for name, value in rows if name == "preset"]
        name = "gpu_1b_fp8.json" if args.fp8 else "gpu_1b.json"
        Path(out, name).write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
