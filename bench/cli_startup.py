"""How long `pax --help` and `pax plugins` take, next to a bare interpreter and `import jax`.

All commands are timed interleaved in one invocation (round-robin, median of the rounds), so the
ratios hold even on a noisy machine. Targets: `pax --help` < 0.3 s, `pax plugins` < 1 s.

    python bench/cli_startup.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import report

PAX = str(Path(sys.executable).with_name("pax"))
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "pax --help": [PAX, "--help"],
    "pax plugins": [PAX, "plugins"],
    "python -c 'import jax'": [sys.executable, "-c", "import jax"],
}
TARGETS = {"pax --help": 0.3, "pax plugins": 1.0}


def _time(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for argv in COMMANDS.values():
        _time(argv)  # warm the file cache
    for _ in range(args.rounds):
        for name, argv in COMMANDS.items():
            samples[name].append(_time(argv))
    medians = {name: statistics.median(s) for name, s in samples.items()}
    jax_import = medians["python -c 'import jax'"]
    rows = [
        {"command": name, "median_s": round(m, 4), "min_s": round(min(samples[name]), 4),
         "vs_import_jax": round(m / jax_import, 3), "target_s": TARGETS.get(name),
         "meets_target": None if name not in TARGETS else m < TARGETS[name]}
        for name, m in medians.items()
    ]
    lines = ["| command | median s | min s | ratio to import jax | target s | meets |",
             "|---|---|---|---|---|---|"]
    lines += [f"| `{r['command']}` | {r['median_s']:.3f} | {r['min_s']:.3f} | "
              f"{r['vs_import_jax']:.2f} | {r['target_s'] or ''} | "
              f"{'' if r['meets_target'] is None else ('yes' if r['meets_target'] else 'NO')} |"
              for r in rows]
    report.save("cli_startup", {"rounds": args.rounds, "rows": rows}, "\n".join(lines))


if __name__ == "__main__":
    main()
