"""Where `pax`'s start-up goes: Python's own import timer (``python -X importtime``) over
`pax --help` and `pax plugins`, summed by top-level package.

Each command runs ``--rounds`` times, interleaved; for every round the self times of the
modules imported are summed per top-level package (the standard library as one, the
editable-install finders as one) and over all; medians over the rounds are reported, with the
wall-clock time of the same processes (the timer adds a little). The modules with the largest
cumulative times (their own and their imports') show which import brought a package in.

    python bench/import_time.py [--rounds 7]

Writes bench/results/import_time.{json,md}.
"""

from __future__ import annotations

import argparse
import collections
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import report

PAX = str(Path(sys.executable).with_name("pax"))
COMMANDS = {"pax --help": ["--help"], "pax plugins": ["plugins"]}
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| *(\S+)$")
SHOWN = 12


def group(module: str) -> str:
    """The package a module is counted under."""
    top = module.split(".")[0]
    if top.startswith("__editable__"):
        return "(editable-install finders)"
    if top in sys.stdlib_module_names or top in ("encodings", "site", "builtins"):
        return "(standard library)"
    return top


def parse(stderr: str) -> tuple[dict[str, float], dict[str, float]]:
    """Milliseconds of self time per package, and of cumulative time per module."""
    by_package: dict[str, float] = collections.defaultdict(float)
    cumulative: dict[str, float] = {}
    for line in stderr.splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        own, total, module = match.groups()
        by_package[group(module)] += int(own) / 1000
        cumulative[module] = int(total) / 1000
    return by_package, cumulative


def measure(args: list[str]) -> tuple[float, dict[str, float], dict[str, float]]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-X", "importtime", PAX, *args], capture_output=True,
                          text=True, check=True)
    wall = time.perf_counter() - started
    return (wall, *parse(done.stderr))


def _medians(samples: list[dict[str, float]]) -> dict[str, float]:
    """Per key, the median over the rounds (a key a round lacks counts 0 there)."""
    keys = set().union(*samples)
    return {k: statistics.median(s.get(k, 0.0) for s in samples) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    for argv in COMMANDS.values():
        measure(argv)  # warm the file cache
    samples: dict[str, list] = {name: [] for name in COMMANDS}
    for _ in range(args.rounds):
        for name, argv in COMMANDS.items():
            samples[name].append(measure(argv))
    commands = []
    for name, runs in samples.items():
        packages = _medians([r[1] for r in runs])
        total = statistics.median(sum(r[1].values()) for r in runs)
        cumulative = _medians([r[2] for r in runs])
        commands.append({
            "command": name, "rounds": args.rounds,
            "wall_ms": 1000 * statistics.median(r[0] for r in runs),
            "imports_ms": total,
            "packages_ms": dict(sorted(packages.items(), key=lambda kv: -kv[1])),
            "cumulative_ms": dict(sorted(cumulative.items(), key=lambda kv: -kv[1])[:SHOWN]),
        })
    lines = ["# `pax` start-up: import time by package (`python -X importtime`)", "",
             f"Medians of {args.rounds} interleaved rounds; milliseconds of the modules' self "
             "time, summed per top-level package.", "",
             "| command | wall (ms) | all imports (ms) |", "|---|---:|---:|"]
    lines += [f"| `{c['command']}` | {c['wall_ms']:.0f} | {c['imports_ms']:.0f} |"
              for c in commands]
    for c in commands:
        lines += ["", f"`{c['command']}`, by package:", "", "| package | ms | share |",
                  "|---|---:|---:|"]
        lines += [f"| {p} | {ms:.1f} | {ms / c['imports_ms']:.1%} |"
                  for p, ms in list(c["packages_ms"].items())[:SHOWN]]
        lines += ["", f"`{c['command']}`, the modules with the largest cumulative times:",
                  "", "| module | cumulative ms |", "|---|---:|"]
        lines += [f"| {m} | {ms:.1f} |" for m, ms in c["cumulative_ms"].items()]
    report.save("import_time", {"commands": commands}, "\n".join(lines))


if __name__ == "__main__":
    main()
