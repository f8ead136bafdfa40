"""`pax sweep` as docs/sweeps.md shows it: the core's ``MlpSynthetic`` tuned over its own search
space (learning rate and width, judged by the held-out loss), random search, ``--trials 12
--parallel 2 --early-stop 100:0.5`` by default; timed, then its table read back from
``pax sweep --show``'s ``results.csv``.

Needs pax-sweep installed beside pax-core (``pip install -e plugins/pax_sweep``), which the
``bench`` nox session does in an environment of its own.

    python bench/sweep_trials.py [--trials 12] [--parallel 2] [--early-stop 100:0.5]

Writes bench/results/sweep_trials.{json,md}.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import report

PAX = str(Path(sys.executable).with_name("pax"))
EXPERIMENT = "MlpSynthetic"


def _pax(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.run([PAX, *args], capture_output=True, text=True,
                          env={**env, "JAX_PLATFORMS": "cpu"})


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def markdown(result: dict) -> str:
    """The trials, best first, as docs/sweeps.md shows them."""
    header = result["header"]
    keys = [h for h in header if h not in ("trial", result["metric"], "steps", "wall_sec",
                                           "status")]
    lines = [f"| trial | {' | '.join(keys)} | {result['metric']} | steps | status |",
             "| --- | " + " | ".join("---:" if isinstance(result["trials"][0][k], float)
                                    else "---" for k in keys) + " | ---: | ---: | --- |"]
    for t in result["trials"]:
        cells = [f"{t[k]:.4f}" if isinstance(t[k], float) else str(t[k]) for k in keys]
        value = t[result["metric"]]
        metric = f"{value:.4f}" if isinstance(value, float) and math.isfinite(value) else ""
        lines.append(f"| {t['trial']:03d} | {' | '.join(cells)} | {metric} | {t['steps']} | "
                     f"{t['status']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--early-stop", default="100:0.5")
    args = parser.parse_args()
    if _pax("sweep", "--help").returncode != 0:
        raise SystemExit("pax sweep is not installed beside this Python; install pax-sweep "
                         "(pip install -e plugins/pax_sweep) and run this again")
    options = ["--exp", EXPERIMENT, "--trials", str(args.trials), "--parallel",
               str(args.parallel), "--early-stop", args.early_stop]
    with tempfile.TemporaryDirectory() as tmp:
        sweep_dir = str(Path(tmp) / "sweep")
        started = time.perf_counter()
        done = _pax("sweep", *options, "--sweep-dir", sweep_dir)
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"pax sweep failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        shown = _pax("sweep", "--sweep-dir", sweep_dir, "--show")
        if shown.returncode != 0:
            raise SystemExit(f"pax sweep --show failed:\n{shown.stderr[-3000:]}")
        with open(Path(sweep_dir) / "results.csv", newline="") as f:
            table = list(csv.reader(f))
    header, rows = table[0], table[1:]
    result = {
        "sweep": f"pax sweep {' '.join(options)}",
        "cores": os.cpu_count(),
        "wall_sec": wall,
        "metric": header[-4],
        "header": header,
        "trials": [{h: _value(v) for h, v in zip(header, row, strict=True)} for row in rows],
    }
    report.save("sweep_trials", result, markdown(result))


if __name__ == "__main__":
    main()
