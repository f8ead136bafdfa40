"""Trains every tiny experiment with paxml's own trainer and writes each one's reference logits:
the checkpoints and logits ``pax import paxml`` is tested against.

For each variant, ``python -m paxml.main --mode=train`` runs in a process of its own (its flags
and global state are per process) into ``OUT/<variant>``, its log going to
``OUT/<variant>.train.log``; then one process restores every job with paxml and writes
``OUT/<variant>/reference.npz`` (see ``reference.py``), so paxml is imported once for all of
them. Prints the wall time of each training run and each export.

Runs with the paxml 1.4 environment's interpreter (Python 3.10)::

    PAXML_PYTHON pax_lm/tests_paxml/praxis_side/train_and_reference.py OUT [VARIANT ...]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODULE = "tiny_experiments"
VARIANTS = ("TinyLm", "TinyLmRotaryGated", "TinyLmRepeatedSeparate")


def _prepare_environment() -> None:
    """Sets the environment paxml runs in, here and in the training processes: this folder
    importable (``--exp`` names a module here), JAX on the CPU, and none of the caller's XLA
    flags (a caller that fakes several host devices would otherwise change the mesh and the
    global batch the jobs train with) but the one Pax's tests compile with: no LLVM
    optimisations, most of a tiny job's time being its compiles."""
    os.environ["XLA_FLAGS"] = "--xla_backend_optimization_level=0"
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (HERE, os.environ.get("PYTHONPATH")) if p)
    if HERE not in sys.path:
        sys.path.insert(0, HERE)


def train(variant: str, out: str) -> float:
    """Trains ``variant`` into ``out/variant`` with paxml.main; returns the wall time."""
    job = os.path.join(out, variant)
    log = os.path.join(out, f"{variant}.train.log")
    command = [
        sys.executable, "-m", "paxml.main", f"--exp={MODULE}.{variant}",
        f"--job_log_dir={job}", "--mode=train", "--noenable_summary_writer",
    ]
    start = time.perf_counter()
    with open(log, "w") as stream:
        result = subprocess.run(command, stdout=stream, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        with open(log) as stream:
            tail = stream.readlines()[-30:]
        sys.stderr.write("".join(tail))
        raise SystemExit(f"paxml.main failed for {variant} (exit {result.returncode}); see {log}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the folder to write one paxml job per variant into")
    parser.add_argument("--jobs", type=int, default=len(VARIANTS),
                        help="training runs at once (default: all; most of each is imports)")
    parser.add_argument("variants", nargs="*", default=list(VARIANTS), metavar="VARIANT",
                        help=f"which experiments to train (default: all of {', '.join(VARIANTS)})")
    args = parser.parse_args()
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        parser.exit(2, f"error: unknown variant(s) {', '.join(unknown)}; "
                       f"choose from {', '.join(VARIANTS)}\n")
    # paxml resumes from a job's checkpoints instead of training, so never reuse a job folder.
    existing = [v for v in args.variants if os.path.exists(os.path.join(args.out, v))]
    if existing:
        parser.exit(2, f"error: {args.out} already holds {', '.join(existing)}; "
                       "give a new output folder\n")
    os.makedirs(args.out, exist_ok=True)

    _prepare_environment()
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        runs = {v: pool.submit(train, v, args.out) for v in args.variants}
    timings = {v: {"train": run.result()} for v, run in runs.items()}

    # paxml is imported only now, once, so that it does not compete with the training runs.
    start = time.perf_counter()
    import reference

    print(f"importing paxml for the exports: {time.perf_counter() - start:.1f} s")

    for variant in args.variants:
        start = time.perf_counter()
        reference.write_reference(f"{MODULE}.{variant}", os.path.join(args.out, variant))
        timings[variant]["reference"] = time.perf_counter() - start

    for variant, seconds in timings.items():
        print(f"{variant}: train {seconds['train']:.1f} s, reference {seconds['reference']:.1f} s")


if __name__ == "__main__":
    main()
