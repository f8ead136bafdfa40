"""`pax plan --target` against published measurements: predicted step time and MFU for every
run of ``bench/data/published_runs.toml``, and `--search`'s ranking of the published mesh.

Each row is planned as a user would (`pax plan --exp E --set ... --target T --slices N
--format json`, a fresh process with the row's chips as fake CPU devices). The comparison is in
step time, predicted over published:

* rows that publish a step time (or tokens per second per chip) are compared with it directly;
* rows that publish only MFU or TFLOP/s per chip (MaxText's tables) are compared through MFU:
  MaxText's counter before its PR #1988 counts the same FLOPs as Pax's ``transformer-v1``
  formula (weights' products x 6, attention over every query-key pair, the output layer) and
  the same bf16 peaks, so the predicted step over the published one is the published MFU over
  the predicted MFU.

A row is within target when that ratio is within 1 +- 0.2. Writes
``bench/results/plan_validation.{json,md}``.

    python bench/plan_validation.py [--search ID,ID ...] [--only ID,ID ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import report

ROWS = Path(__file__).parent / "data" / "published_runs.toml"
TOLERANCE = 0.2


def _plan(row: dict, *extra: str) -> dict:
    command = [str(Path(sys.executable).parent / "pax"), "plan", "--exp", row["exp"],
               "--plugin", "lm", *(a for item in row.get("set", []) for a in ("--set", item)),
               "--target", row["target"], "--slices", str(row.get("slices", 1)),
               "--format", "json", *extra]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{row['id']}: {done.stderr.strip().splitlines()[-1]}")
    return json.loads(done.stdout)


def _ratio(published: dict, prediction: dict, tokens: int | None) -> tuple[float, str]:
    """Predicted step time over published, and what it was compared by."""
    if "step_seconds" in published:
        return prediction["step_seconds"] / published["step_seconds"], "step time"
    if "tokens_per_sec_per_chip" in published:
        return (published["tokens_per_sec_per_chip"] / prediction["tokens_per_sec_per_chip"],
                "tokens/s per chip")
    return published["mfu"] / prediction["mfu"], "MFU"


def validate(rows: list[dict]) -> list[dict]:
    found = []
    for row in rows:
        start = time.perf_counter()
        planned = _plan(row)
        prediction = planned["prediction"]
        ratio, basis = _ratio(row["published"], prediction, planned["tokens_per_step"])
        found.append({
            "id": row["id"], "target": row["target"], "slices": row.get("slices", 1),
            "exp": row["exp"], "set": row.get("set", []), "source": row["source"],
            "published": row["published"], "mfu_basis": row.get("mfu_basis"),
            "compared_by": basis, "ratio": ratio, "within": abs(ratio - 1) <= TOLERANCE,
            "predicted_step_seconds": prediction["step_seconds"],
            "predicted_mfu": prediction["mfu"],
            "predicted_tokens_per_sec_per_chip": prediction["tokens_per_sec_per_chip"],
            "bottleneck": prediction["bottleneck"], "fits": prediction["fits"],
            "exposed_collective_seconds": prediction["exposed_collective_seconds"],
            "top_costs": prediction["top_costs"][:3],
            "plan_seconds": time.perf_counter() - start,
        })
        print(f"{row['id']}: predicted/published step {ratio:.3f} ({basis})", flush=True)
    return found


def _mesh_of(items: list[str]) -> str | None:
    return next((i.split("=", 1)[1].replace(" ", "") for i in items
                 if i.startswith("ICI_MESH_SHAPE=")), None)


def _published_mesh(row: dict) -> str:
    """The row's ICI mesh: its ``--set``, else its experiment's own."""
    from pax_core.config.resolve import experiment_class
    from pax_core.plugins.host import PluginHost

    given = _mesh_of(row.get("set", []))
    if given:
        return given
    _, cls = experiment_class(PluginHost(), row["exp"], "lm", row.get("set", []))
    return "[" + ",".join(str(n) for n in cls.ICI_MESH_SHAPE) + "]"


def search(row: dict) -> dict:
    """Where `pax plan --search` ranks the published mesh among the candidates that fit."""
    planned = _plan(row, "--search")
    published = _published_mesh(row)
    meshes = [_mesh_of(c["set"]) for c in planned["ranked"]]
    rank = meshes.index(published) + 1 if published in meshes else None
    best = planned["ranked"][0] if planned["ranked"] else None
    mine = planned["ranked"][rank - 1] if rank else None
    return {
        "id": row["id"], "target": row["target"], "published_mesh": published, "rank": rank,
        "candidates": planned["tried"], "fitting": len(planned["ranked"]),
        "dropped": planned["dropped"],
        "best_mesh": _mesh_of(best["set"]) if best else None,
        "best_step_seconds": best["prediction"]["step_seconds"] if best else None,
        "published_mesh_step_seconds": mine["prediction"]["step_seconds"] if mine else None,
        "ranking": [(_mesh_of(c["set"]), round(c["prediction"]["step_seconds"], 4),
                     c["prediction"]["fits"]) for c in planned["ranked"][:8]],
    }


def markdown(result: dict) -> str:
    """The comparison and the searches as tables (docs/predicting-speed.md shows them)."""
    found, searched = result["rows"], result["search"]
    within = sum(r["within"] for r in found)
    chips = sorted({r["target"].split("-")[0] for r in found if r["within"]})
    lines = [
        f"{within} of {len(found)} published runs within ±{result['tolerance']:.0%} of their "
        f"step time (chips within: {', '.join(chips)}).", "",
        "| run | target | published | compared by | predicted step | predicted MFU | "
        "predicted / published | within | bottleneck |",
        "|---|---|---|---|---:|---:|---:|:-:|---|"]
    for r in found:
        published = ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in r["published"].items())
        slices = f" x{r['slices']}" if r["slices"] > 1 else ""
        lines.append(
            f"| {r['id']} | {r['target']}{slices} | {published} | {r['compared_by']} | "
            f"{r['predicted_step_seconds']:.2f} s | {r['predicted_mfu']:.1%} | "
            f"{r['ratio']:.3f} | {'yes' if r['within'] else 'no'} | {r['bottleneck']} |")
    if searched:
        lines += ["", "| `--search` on | target | published mesh | its rank | candidates "
                  "(kept) | first-ranked mesh | its step / the published mesh's |",
                  "|---|---|---|---:|---:|---|---:|"]
        for s in searched:
            versus = (f"{s['best_step_seconds'] / s['published_mesh_step_seconds']:.3f}"
                      if s["published_mesh_step_seconds"] else "-")
            lines.append(f"| {s['id']} | {s['target']} | {s['published_mesh']} | "
                         f"{s['rank'] or 'dropped'} | {s['candidates']} ({s['fitting']}) | "
                         f"{s['best_mesh']} | {versus} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="Row ids to plan (comma-separated).")
    parser.add_argument("--search", default="", help="Row ids to run --search on.")
    args = parser.parse_args()
    rows = tomllib.loads(ROWS.read_text())["run"]
    only = {i for i in args.only.split(",") if i}
    chosen = [r for r in rows if not only or r["id"] in only]
    found = validate(chosen)
    searched = [search(r) for r in rows if r["id"] in set(args.search.split(","))]
    result = {"rows": found, "search": searched, "tolerance": TOLERANCE}
    report.save("plan_validation", result,
                f"# `pax plan --target` against published measurements\n\n{markdown(result)}")


if __name__ == "__main__":
    main()
