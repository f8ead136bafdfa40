"""`pax plan` over the LM catalogue: parameters, per-device memory and fit, as a table.

Every registered pax-lm experiment whose mesh has at most 512 devices, and every pipelined one
(up to 1024), is compiled on fake CPU devices (512 or 1024 in one process; Pax's data-parallel
experiments on 8); pipelined ones add their stages, microbatches and bubble. Writes
``bench/results/plan_catalogue.{json,md}``.

    python bench/plan_catalogue.py [--hbm-gib 32]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import report

SCRIPT = """
import json, sys
from pax_core.commands import plan
from pax_core.plugins.host import PluginHost
plan.use_fake_devices(int(sys.argv[1]))
host = PluginHost()
for name in sys.argv[3:]:
    try:
        result = plan.plan(host, exp=name, plugin="lm", set_items=[], hbm_gib=float(sys.argv[2]))
        print("PLAN", json.dumps(result.as_json()), flush=True)
    except Exception as e:
        print("PLAN", json.dumps({"experiment": name, "error": str(e)}), flush=True)
"""


def _groups() -> dict[int, list[str]]:
    import importlib

    from pax_lm.experiments.base import PipelinedExperiment
    from pax_lm.experiments.catalogue import EXPERIMENTS

    groups: dict[int, list[str]] = {8: [], 512: [], 1024: []}
    for ref in EXPERIMENTS:
        module, _, name = ref.target.partition(":")
        cls = getattr(importlib.import_module(module), name)
        if issubclass(cls, PipelinedExperiment):
            groups[1024].append(ref.name)
        elif cls.ICI_MESH_SHAPE is None:
            groups[8].append(ref.name)
        elif cls.mesh_size() <= 512:
            groups[512].append(ref.name)
    return groups


def _pipeline(facts: dict) -> str:
    if "pipeline_stages" not in facts:
        return "-"
    repeat = facts["pipeline_circular_repeat"]
    return (f"{facts['pipeline_schedule']} {facts['pipeline_stages']} x "
            f"{facts['pipeline_microbatches']}{f' x R{repeat}' if repeat > 1 else ''}"
            f"{' stream' if facts['pipeline_stream_io'] else ''}, "
            f"{facts['pipeline_iterations']}, {facts['pipeline_bubble']:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hbm-gib", type=float, default=32.0)
    args = parser.parse_args()
    plans = []
    for devices, names in _groups().items():
        out = subprocess.run([sys.executable, "-c", SCRIPT, str(devices), str(args.hbm_gib),
                              *names], capture_output=True, text=True, check=True).stdout
        plans += [json.loads(line[5:]) for line in out.splitlines() if line.startswith("PLAN ")]
    lines = ["| experiment | devices | parameters | GiB/device (params + opt + temp) | "
             f"fits {args.hbm_gib:g} GiB | pipeline (stages x microbatches, iterations, bubble) |",
             "|---|---|---|---|---|---|"]
    for p in plans:
        if "error" in p:
            lines.append(f"| {p['experiment']} | - | - | {p['error']} | - | - |")
            continue
        lines.append(
            f"| {p['experiment'].split('/')[-1]} | {p['devices']} | {p['params'] / 1e9:.2f}B | "
            f"{p['total_gib']:.1f} ({p['params_gib']:.1f} + {p['opt_state_gib']:.1f} + "
            f"{p['temporaries_gib']:.1f}) | {'yes' if p['fits'] else 'no'} | "
            f"{_pipeline(p.get('placement', {}))} |")
    report.save("plan_catalogue", plans, "\n".join(lines))


if __name__ == "__main__":
    main()
