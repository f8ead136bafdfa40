"""How long `pax --help` and `pax plugins` take, next to a bare interpreter and `import jax`,
with whatever plugins are installed (the count is reported).

All commands are timed interleaved in one invocation (round-robin, median of the rounds), so the
ratios hold even on a noisy machine; the CPU seconds each command's process used (user and
system) are reported too, which another process's load changes little. The targets hold the CPU
time: `pax --help` ≤ 0.2 s, `pax plugins` < 1 s.

    python bench/cli_startup.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
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
TARGETS = {"pax --help": 0.2, "pax plugins": 1.0}


def _time(argv: list[str]) -> tuple[float, float]:
    """The command's wall seconds and its process's CPU seconds (user + system)."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    if status:
        raise SystemExit(f"{argv} failed ({status})")
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime


def _plugins() -> int:
    listed = subprocess.run([PAX, "plugins", "--format", "tsv"], check=True,
                            capture_output=True, text=True).stdout.splitlines()
    return len(listed) - 1  # the header


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in COMMANDS}
    for argv in COMMANDS.values():
        _time(argv)  # warm the file cache
    for _ in range(args.rounds):
        for name, argv in COMMANDS.items():
            samples[name].append(_time(argv))
    wall = {name: statistics.median(w for w, _ in s) for name, s in samples.items()}
    cpu = {name: statistics.median(c for _, c in s) for name, s in samples.items()}
    jax_import = wall["python -c 'import jax'"]
    rows = [
        {"command": name, "median_s": round(m, 4), "min_s": round(min(w for w, _ in
                                                                      samples[name]), 4),
         "cpu_s": round(cpu[name], 4), "vs_import_jax": round(m / jax_import, 3),
         "target_cpu_s": TARGETS.get(name),
         "meets_target": None if name not in TARGETS else cpu[name] <= TARGETS[name]}
        for name, m in wall.items()
    ]
    plugins = _plugins()
    lines = ["| command | median s | min s | CPU s (median) | ratio to import jax | "
             "target CPU s | meets |", "|---|---|---|---|---|---|---|"]
    lines += [f"| `{r['command']}` | {r['median_s']:.3f} | {r['min_s']:.3f} | "
              f"{r['cpu_s']:.3f} | {r['vs_import_jax']:.2f} | {r['target_cpu_s'] or ''} | "
              f"{'' if r['meets_target'] is None else ('yes' if r['meets_target'] else 'NO')} |"
              for r in rows]
    lines += ["", f"{plugins} plugins active (`pax plugins`), {args.rounds} rounds."]
    report.save("cli_startup", {"rounds": args.rounds, "plugins": plugins, "rows": rows},
                "\n".join(lines))


if __name__ == "__main__":
    main()
