"""The documentation's measured tables, generated from the committed results in bench/results/.

Each generated passage of a page (README.md or docs/*.md) lies between ``<!-- bench:NAME -->``
and ``<!-- /bench:NAME -->``; this rewrites every such block from the results (JSON) of the
script that measured it, with the commit, date and command they were measured at, so that no
figure the pages quote is typed by hand. Each block is on one page, once. ``--check`` changes
nothing and exits 1 when a block differs from what the results give (tests/test_doc_tables.py
runs it).

    python bench/doc_tables.py [--check] [--page FILE ...] [--results bench/results]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import report
from plan_validation import markdown as validation_table
from sweep_trials import markdown as sweep_table

README = report.ROOT / "README.md"
_BLOCK = re.compile(r"(<!-- bench:([\w-]+) -->\n)(.*?)(<!-- /bench:\2 -->)", re.DOTALL)
_OPENING = re.compile(r"<!-- bench:([\w-]+) -->")
WIDTH = 100


class ResultsError(Exception):
    """A block that cannot be generated: its results are missing or it is unknown."""


def load(name: str, folder: Path) -> dict[str, Any]:
    path = folder / f"{name}.json"
    if not path.exists():
        raise ResultsError(f"{path} is missing; run python bench/{name}.py to measure it")
    found = json.loads(path.read_text())
    if "provenance" not in found:
        raise ResultsError(f"{path} does not say where it was measured (no provenance); run "
                           f"python bench/{name}.py to measure it again")
    return found


def _span(values: list[float], spec: str) -> str:
    """``0.35 to 0.41``, or one value when they are all the same when printed."""
    low, high = format(min(values), spec), format(max(values), spec)
    return low if low == high else f"{low} to {high}"


def _measured(*results: dict[str, Any]) -> str:
    """Where ``results`` were measured: one sentence for those of one commit and date."""
    groups: dict[tuple, list[str]] = {}
    for r in results:
        found = dict(r["provenance"])
        command = found.pop("command")
        groups.setdefault(tuple(sorted(found.items())), []).append(command)
    return " ".join(report.describe({**dict(key), "command": "`, `".join(commands)})
                    for key, commands in groups.items())


def _wrapped(text: str) -> str:
    """A paragraph of prose as the pages wrap their own, at 100 columns."""
    return textwrap.fill(text, WIDTH, break_long_words=False, break_on_hyphens=False)


def _pipeline(row: dict[str, Any]) -> str:
    """A pipelined configuration as the pages name it: ``GPipe, M=8``."""
    schedule = ("GPipe" if row["schedule"] == "gpipe" else
                f"circular (R={row['circular_repeat']})")
    return f"{schedule}, M={row['microbatches']}"


def pipeline_speed(folder: Path) -> str:
    found = load("pipeline_speed", folder)
    model, rows = found["model"], found["rows"]
    stages = {r["stages"] for r in rows if "stages" in r}
    replicas = {r["mesh"]["replica"] for r in rows if "stages" in r}
    lines = [_wrapped(f"{model['num_layers']}-layer d-{model['model_dims']} LM, batch "
             f"{found['batch']} x {found['length']} tokens, {model['remat_policy']} remat, Adam, "
             f"{found['devices']} fake CPU devices on {found['host_cores']} cores; pipelines over "
             f"{' or '.join(map(str, sorted(stages)))} stages x replica "
             f"{' or '.join(map(str, sorted(replicas)))}; median step of {found['rounds']} "
             f"interleaved rounds of {found['steps']} steps. {_measured(found)}"), "",
             "| configuration | step (ms) | / unpipelined | bubble | 1 / (1 - bubble) | rest |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "schedule" not in r:
            lines.append(f"| {r['configuration']} | {r['step_ms']:.0f} | {r['ratio']:.2f} | - "
                         "| - | - |")
            continue
        lines.append(f"| {_pipeline(r)} | {r['step_ms']:.0f} | {r['ratio']:.2f} | "
                     f"{r['bubble']:.3f} | {r['predicted_ratio']:.2f} | {r['rest']:.2f} |")
    piped = [r for r in rows if "rest" in r]
    low, high = min(piped, key=lambda r: r["rest"]), max(piped, key=lambda r: r["rest"])
    lines += ["", _wrapped(f"What the bubble formula leaves (\"rest\": measured / unpipelined "
                           f"/ predicted) runs from {low['rest']:.2f} ({_pipeline(low)}) to "
                           f"{high['rest']:.2f} ({_pipeline(high)}).")]
    return "\n".join(lines)


def pipeline_grads(folder: Path) -> str:
    found = load("pipeline_grads", folder)
    piped = [r["vs_unpipelined"] for r in found["rows"] if r["vs_unpipelined"] is not None]
    one = max(r["vs_one_device"]["max_rel"] for r in found["rows"])
    return _wrapped(
        f"Over one batch from the same weights, the {len(piped)} pipelines' gradients differ "
        f"from those of the model unpipelined on the same {found['devices']} devices by at "
        f"most {max(r['max_rel'] for r in piped):.1e} of each parameter's largest gradient "
        f"element (relative L2 at most {max(r['rel_l2'] for r in piped):.1e}; the loss's "
        f"relative difference at most {max(r['loss_rel'] for r in piped):.1e}); on one "
        f"device the unpipelined model's own differ from those by up to {one:.1e}. "
        f"{_measured(found)}")


def train_speed(folder: Path) -> str:
    found = load("train_speed", folder)
    models = found["models"]
    rounds = ", ".join(f"{m['rounds']} for the {m['model']}" for m in models)
    peak = found["matmul_peak_flops_per_sec"]["float32"] / 1e9
    steps = _span([m["steps"] for m in models], "d")
    lines = [_wrapped(f"One CPU device, float32, {steps} steps, on {found['machine']} (XLA "
                      f"matmul peak {peak:,.0f} GFLOP/s), medians of rounds ({rounds}); every "
                      f"run saves a final checkpoint. "
                      f"{_measured(*(m if 'provenance' in m else found for m in models))}"), "",
             "| model | hand tokens/s | bare | pax | pax/hand | pax MFU | whole run hand | pax "
             "| first step cold | warm | a step | peak MiB hand | pax | commit |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
             "| ---: | --- |"]
    for m in models:
        hand, bare, pax = m["hand"], m["bare"], m["pax"]
        lines.append(
            f"| {m['model']} | {hand['tokens_per_sec']:,.0f} | {bare['tokens_per_sec']:,.0f} | "
            f"{pax['tokens_per_sec']:,.0f} | {m['speed_vs_hand']:.3f} | {pax['mfu']:.1%} | "
            f"{hand['wall_sec']:.1f} s | {pax['wall_sec']:.1f} s | "
            f"{pax['first_step_sec']:.2f} s | {pax['warm_first_step_sec']:.2f} s | "
            f"{m['step_sec']:.2f} s | {hand['peak_rss_mib']:,.0f} | {pax['peak_rss_mib']:,.0f} | "
            f"{m.get('provenance', found['provenance'])['commit']} |")
    return "\n".join(lines)


def speed_notes(folder: Path) -> str:
    speed, compiled, hlo = (load(name, folder) for name in ("train_speed", "compile_memory",
                                                             "step_hlo"))
    models, first, step = speed["models"], compiled["models"][0], hlo["models"][0]
    warm = first["warm"]["phases_sec"]
    later = [m["pax"]["startup_sec"] - m["hand"]["startup_sec"] for m in models]
    kept = first["cold_no_give_back"]
    products = step["matmuls"]
    same = (f"the same {products['pax']} matrix products as the bare step's"
            if products["same"] else
            f"{products['pax']} matrix products against the bare step's {products['bare']}")
    return _wrapped(
        f"\"Warm\" is a rerun with the compilation cache filled. What is left of its first step "
        f"is tracing and lowering the step ({warm['trace'] + warm['lower']:.2f} s for the "
        f"{first['model']}: JAX needs the lowered program to look it up), reading the cache "
        f"({warm['cache_read']:.2f} s) and one step's execution, which no cache removes: less "
        f"one step, warm takes {_span([m['warm_compile_ratio'] for m in models], '.2f')} of "
        f"cold. Pax ends its first step {_span(later, '.1f')} s after the hand-written script "
        f"(its imports, the experiment's config, reading the corpus, the loggers), and peaks "
        f"at {_span([m['memory_vs_hand'] for m in models], '.2f')} x its memory. Before "
        f"training it gives the heap the compiler freed back to the system (`malloc_trim`): "
        f"{first['given_back_mib']:,.0f} MiB for the {first['model']}; without it, its "
        f"training steps peaked {first['training_peak_ratio']:.2f} x as high "
        f"({kept['training_peak_mib']:,.0f} MiB) and the process "
        f"{first['process_peak_ratio']:.2f} x ({kept['process_peak_mib']:,.0f} MiB). "
        f"Compiled, the {step['model']}'s train step holds {same}, and XLA counts "
        f"{step['cost_ratio']['flops'] - 1:.3%} more FLOPs and "
        f"{step['cost_ratio']['bytes accessed'] - 1:.3%} more bytes accessed in it (the loss's "
        f"metrics, the gradient norm, the anomaly check). {_timed_steps(hlo['models'])}"
        f"{_measured(speed, compiled, hlo)}")


def _timed_steps(models: list[dict]) -> str:
    """A sentence on the train steps timed alone, one program after the other in a process."""
    timed = [m for m in models if "step_sec" in m]
    if not timed:
        return ""
    each = "; ".join(f"{m['step_sec']['pax']:.3f} s in Pax and {m['step_sec']['bare']:.3f} s "
                     f"bare for the {m['model']}" for m in timed)
    return (f"Run in turn in one process from the same state, a step takes {each} (medians of "
            f"{timed[0]['step_repeats']}): what separates pax from bare in the table above is "
            f"the loop around the step, not the step. ")


def sweep_trials(folder: Path) -> str:
    found = load("sweep_trials", folder)
    trials, metric = found["trials"], found["metric"]
    done = [t for t in trials if t["status"] == "completed"]
    stopped = [t for t in trials if t["status"] == "stopped early"]
    best = min(t[metric] for t in done)
    good = [t for t in done if t[metric] <= 2 * best]
    rates = [t["LEARNING_RATE"] for t in good]
    widths = sorted({t["HIDDEN_DIMS"] for t in good}, key=lambda w: (len(w), w))
    early = f"`{found['sweep'].split('--early-stop ')[1].split()[0]}`"
    prose = (f"`{found['sweep']}` on {found['cores']} CPU cores took {found['wall_sec']:.0f} s "
            f"({len(trials)} trials of up to {max(t['steps'] for t in trials)} steps). The "
            f"completed trials within twice the best {metric} ({best:.4f}) have learning "
            f"rates from {min(rates):.2g} to {max(rates):.2g}, with widths "
            f"{', '.join(widths)}; the rule ({early}) stopped {len(stopped)} trials early, at "
            f"steps {', '.join(str(t['steps']) for t in stopped)}. {_measured(found)}")
    return f"{_wrapped(prose)}\n\n{sweep_table(found)}"


def plan_validation(folder: Path) -> str:
    found = load("plan_validation", folder)
    return f"{validation_table(found)}\n{_wrapped(_measured(found))}"


BLOCKS: dict[str, Callable[[Path], str]] = {
    "pipeline_speed": pipeline_speed,
    "pipeline_grads": pipeline_grads,
    "train_speed": train_speed,
    "speed_notes": speed_notes,
    "sweep_trials": sweep_trials,
    "plan_validation": plan_validation,
}


def pages() -> list[Path]:
    """The pages that may hold blocks: README.md and the documentation's."""
    return [README, *sorted((report.ROOT / "docs").glob("*.md"))]


def rewrite(texts: dict[Path, str], folder: Path = report.FOLDER) -> dict[Path, str]:
    """Each page's text with its blocks generated again; each of ``BLOCKS`` must be in one of
    the pages, once."""
    opened = [name for text in texts.values() for name in _OPENING.findall(text)]
    closed = [m.group(2) for text in texts.values() for m in _BLOCK.finditer(text)]
    unknown = sorted(set(opened) - set(BLOCKS))
    if unknown:
        raise ResultsError(f"the pages have blocks no results generate ({', '.join(unknown)}); "
                           f"known: {', '.join(BLOCKS)}")
    for name in BLOCKS:
        if opened.count(name) != 1 or closed.count(name) != 1:
            raise ResultsError(f"the pages need one '<!-- bench:{name} -->' ... "
                               f"'<!-- /bench:{name} -->' block; they have {opened.count(name)} "
                               f"opening and {closed.count(name)} complete")
    return {page: _BLOCK.sub(lambda m: f"{m.group(1)}{BLOCKS[m.group(2)](folder)}\n{m.group(4)}",
                             text)
            for page, text in texts.items()}


def differing(texts: dict[Path, str], folder: Path = report.FOLDER) -> dict[Path, list[str]]:
    """Page -> the names of its blocks that differ from what the results generate."""
    found = {}
    for page, text in rewrite(texts, folder).items():
        want = {m.group(2): m.group(3) for m in _BLOCK.finditer(text)}
        stale = [m.group(2) for m in _BLOCK.finditer(texts[page]) if want[m.group(2)] != m.group(3)]
        if stale:
            found[page] = stale
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 when a block differs from the results")
    parser.add_argument("--page", type=Path, action="append", dest="pages",
                        help="a page to read (repeatable); default README.md and docs/*.md")
    parser.add_argument("--results", type=Path, default=report.FOLDER,
                        help="the folder of results (default bench/results)")
    args = parser.parse_args()
    try:
        texts = {page: page.read_text() for page in args.pages or pages()}
        stale = differing(texts, args.results)
        if args.check:
            if stale:
                sys.exit("; ".join(f"{page}: blocks {', '.join(names)} differ"
                                   for page, names in stale.items())
                         + f" from what {args.results} gives; run python bench/doc_tables.py")
            return
        for page, text in rewrite(texts, args.results).items():
            if page in stale:
                page.write_text(text)
    except (OSError, ResultsError) as e:
        print(f"doc_tables: {e}", file=sys.stderr)
        sys.exit(2)
    count = sum(len(names) for names in stale.values())
    print(f"{count} of {len(BLOCKS)} blocks rewritten"
          + "".join(f"; {page}: {', '.join(names)}" for page, names in stale.items()))


if __name__ == "__main__":
    main()
