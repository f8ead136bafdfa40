"""Where a TPU train step's time goes: the traces ``bench/tpu_train.py``'s ``profile`` step
brings back from the chip (``pax-MODEL.xplane.pb``, ``hand-MODEL.xplane.pb``), read here with
xprof's HLO statistics (``pip install xprof``; it is needed here only, not on the chip).

Each operation of the compiled step is put in one group by what it computes (matrix products,
the attention kernel, rotary, the optimizer's update, ...), read from the framework op name the
trace keeps for it. A step's time is the chip's compute time a whole step (xprof's input
pipeline analysis of the steps the trace holds whole), and the groups share it as they share
the traced time, which also holds the parts of the steps the trace cut. (The columns of traces
from before 283376c divided the traced time by the attention kernel's forward calls over the
layers, which counted such parts as whole steps: up to 2 % short.)

    python bench/tpu_profile.py DIR/pax-470m.xplane.pb@COMMIT ...

(each trace with the commit the chip traced, and what else tells it apart, such as
``@6abb953, SAVE_QKV_OUT_PROJ``; a column each, added to the columns of other names read
before).

Writes bench/results/tpu_profile.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import report

# The HLO categories of elementwise work and of moving data between layouts.
ELEMENTWISE = ("loop fusion", "data formatting", "non-fusion elementwise", "broadcast",
               "copy-done", "dynamic-update-slice", "custom fusion")


def _tool(trace: Path, name: str) -> object:
    """xprof's tool ``name`` over one trace, as JSON."""
    from xprof.convert import raw_to_tool_data

    with tempfile.TemporaryDirectory() as tmp:  # xprof caches its work beside the trace
        copy = Path(tmp) / trace.name
        shutil.copy(trace, copy)
        data, _ = raw_to_tool_data.xspace_to_tool_data([str(copy)], name,
                                                       {"use_saved_result": False})
    return json.loads(data)


def step_compute_ms(trace: Path) -> float:
    """The chip's compute time in a step, averaged over the steps the trace holds whole."""
    found = _tool(trace, "input_pipeline_analyzer")
    return next(float(t["p"]["tc_compute_ms_average"]) for t in found
                if "tc_compute_ms_average" in t.get("p", {}))


def rows(trace: Path) -> list[dict]:
    """xprof's HLO statistics of one trace, a dict per operation."""
    table = _tool(trace, "hlo_stats")
    names = [c["id"] for c in table["cols"]]
    return [dict(zip(names, [c["v"] if c else None for c in row["c"]], strict=True))
            for row in table["rows"]]


def group(row: dict) -> str:
    """What an operation computes: the attention kernel, the optimizer's update (the
    elementwise work outside the layers' loop that adds), matrix products, other elementwise
    work and layout changes (norms, rotary, activations, the attention's transposes), or the
    rest."""
    where = row["tf_op_name"] or ""
    if row["hlo_op_name"].startswith("splash_mha"):
        return "attention kernel"
    if row["category"] == "convolution fusion":
        return "matrix products"
    if "while" not in where and where.rstrip(": ").endswith("/add"):
        return "optimizer update"
    if row["category"] in ELEMENTWISE:
        return "other elementwise and layout"
    return "other"


def breakdown(trace: Path, commit: str) -> dict:
    """Milliseconds a step in each group, and the operations that cost most."""
    found = rows(trace)
    forward = [r["occurrences"] for r in found if r["hlo_op_name"].startswith("splash_mha_fwd")]
    steps = sum(r["total_self_time"] for r in found) / 1e3 / step_compute_ms(trace)
    groups: dict[str, float] = {}
    for r in found:
        groups[group(r)] = groups.get(group(r), 0.0) + r["total_self_time"] / steps / 1e3
    top = sorted(found, key=lambda r: -r["total_self_time"])[:15]
    return {"trace": f"{trace.name.removesuffix('.xplane.pb')} at {commit}", "commit": commit,
            "steps_traced": round(steps, 2),
            "step_ms": sum(groups.values()),
            "groups_ms": dict(sorted(groups.items(), key=lambda kv: -kv[1])),
            "attention_forward_calls_per_layer": len(forward),
            "top": [{"op": r["hlo_op_name"], "group": group(r),
                     "ms_per_step": r["total_self_time"] / steps / 1e3,
                     "calls_per_step": r["occurrences"] / steps,
                     "tflops": r["model_flop_rate"] / 1e3 if r["model_flop_rate"] else 0.0,
                     "output": r["hlo_op_expression"].split(" = ", 1)[-1].split(" fusion(")[0]
                     .split(" custom-call(")[0][:120],
                     "where": (r["tf_op_name"] or "")[-100:]} for r in top]}


def markdown(found: dict) -> str:
    traces = found["traces"]
    names = sorted({g for t in traces for g in t["groups_ms"]},
                   key=lambda g: -traces[0]["groups_ms"].get(g, 0.0))
    lines = ["# Where a TPU step's time goes", "",
             "Milliseconds a step, one v5e chip, from xprof's HLO statistics of traced steps.", "",
             "| group | " + " | ".join(t["trace"] for t in traces) + " |",
             "|---|" + "---:|" * len(traces)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{t['groups_ms'].get(name, 0.0):.1f}"
                                                for t in traces) + " |")
    lines.append("| **step** | " + " | ".join(f"**{t['step_ms']:.1f}**" for t in traces) + " |")
    lines.append("| attention forward calls a layer | " + " | ".join(
        str(t["attention_forward_calls_per_layer"]) for t in traces) + " |")
    for t in traces:
        lines += ["", f"Costliest operations of {t['trace']}:", "",
                  "| op | group | ms a step | calls a step | TFLOP/s | output |",
                  "|---|---|---:|---:|---:|---|"]
        lines += [f"| {r['op']} | {r['group']} | {r['ms_per_step']:.2f} | "
                  f"{r['calls_per_step']:.0f} | {r['tflops']:.0f} | `{r['output'][:70]}` |"
                  for r in t["top"]]
    lines.append("\nTraced on the chip at each column's commit by `python bench/tpu_train.py "
                 "--steps profile-MODEL-POLICY` (Pax at that policy, the hand-written loop at "
                 "the policy its column names, qkv_out where it names none); read by `python "
                 "bench/tpu_profile.py`.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", metavar="TRACE@COMMIT")
    args = parser.parse_args()
    traces = [t.rpartition("@") for t in args.traces]
    read = [breakdown(Path(path), commit) for path, _, commit in traces]
    found = {"commit": "each trace's",
             "traces": report.kept("tpu_profile", "traces", "trace", read) + read}
    report.save("tpu_profile", found, markdown(found))


if __name__ == "__main__":
    main()
