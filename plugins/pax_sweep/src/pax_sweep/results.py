"""A sweep's results: the table of trials sorted by the metric, ``results.csv``, and
``results.png`` (the metric against each hyper-parameter, and the learning curves of the best
trials)."""

from __future__ import annotations

import ast
import csv
import io
import math
from pathlib import Path
from typing import Any

from pax_core import UsageError, write_atomic
from pax_sweep import metrics, space
from pax_sweep.record import COMPLETED, STOPPED_EARLY, SweepDir, Trial

BEST_CURVES = 3


def chosen_values(trial: Trial) -> dict[str, Any]:
    """The trial's hyper-parameters as values (its ``--set`` items read back)."""
    out = {}
    for item in trial.overrides:
        key, _, text = item.partition("=")
        out[key] = ast.literal_eval(text)
    return out


def ranked(trials: list[Trial], goal: str) -> list[Trial]:
    """Completed trials best first, then those stopped early (their metric is partial), best
    first; then the others (running, failed, left out, or with no finite metric), by number."""
    def best_first(status: str) -> list[Trial]:
        scored = [t for t in trials if t.status == status and _finite(t.metric)]
        return sorted(scored, key=lambda t: t.metric if goal == "minimize" else -t.metric)

    first = best_first(COMPLETED) + best_first(STOPPED_EARLY)
    return first + [t for t in trials if t not in first]


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)


def rows(sweep_dir: SweepDir) -> tuple[dict[str, Any], list[str], list[list[Any]], list[Trial]]:
    """The sweep's definition, the table's header and rows (best first), and the ranked
    trials; every completed trial's metric is read again from its metrics."""
    definition = sweep_dir.definition()
    if definition is None:
        raise UsageError(f"--sweep-dir {sweep_dir.path} holds no sweep (no sweep.json); give "
                         f"the folder of a pax sweep")
    metric, goal = definition["metric"], definition["goal"]
    trials = sweep_dir.trials()
    for trial in trials:
        if trial.status in (COMPLETED, STOPPED_EARLY):
            trial.metric, trial.steps = metrics.final(sweep_dir.job_dir(trial), metric)
    keys = sorted(definition["search"])
    header = ["trial", *keys, metric, "steps", "wall_sec", "status"]
    order = ranked(trials, goal)
    table = []
    for trial in order:
        values = chosen_values(trial)
        table.append([trial.name, *[values.get(k) for k in keys], trial.metric, trial.steps,
                      round(trial.wall_sec, 1), trial.status])
    return definition, header, table, order


def write_csv(path: Path, header: list[str], table: list[list[Any]]) -> None:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows([["" if v is None else v for v in row] for row in table])
    write_atomic(path, out.getvalue())


def plot(path: Path, sweep_dir: SweepDir, definition: dict[str, Any],
         trials: list[Trial]) -> None:
    """One panel per hyper-parameter (the metric of each completed trial against its value:
    log scale for a log-scaled float, categories in order otherwise) and one of the best
    trials' learning curves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric, keys = definition["metric"], sorted(definition["search"])
    done = [t for t in trials if t.status == COMPLETED and _finite(t.metric)]
    panels = len(keys) + 1
    columns = min(panels, 3)
    lines = math.ceil(panels / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(4.2 * columns, 3.4 * lines),
                             squeeze=False)
    flat = list(axes.flat)
    for ax, key in zip(flat, keys, strict=False):
        values = [chosen_values(t)[key] for t in done]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        if numeric:
            ax.scatter(values, [t.metric for t in done])
            if values and min(values) > 0 and max(values) >= 20 * min(values):
                ax.set_xscale("log")
        else:
            labels = _in_order(values)
            ax.scatter([labels.index(repr(v)) for v in values], [t.metric for t in done])
            ax.set_xticks(range(len(labels)), labels, rotation=20)
        ax.set_xlabel(key)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    curves = flat[len(keys)]
    shown = _curve_metric(sweep_dir, metric, done[:BEST_CURVES])
    for trial in done[:BEST_CURVES]:
        points = metrics.curve(sweep_dir.job_dir(trial), shown)
        curves.plot([s for s, _ in points], [v for _, v in points], marker=".",
                    label=f"{trial.name}: " + " ".join(
                        f"{k}={_cell('', v)}" for k, v in chosen_values(trial).items()))
    curves.set_xlabel("step")
    curves.set_ylabel(shown)
    curves.set_title(f"best {min(BEST_CURVES, len(done))} trials" if done else
                     "no trial has completed")
    curves.grid(alpha=0.3)
    if done:
        curves.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    for ax in flat[panels:]:
        ax.set_visible(False)
    fig.suptitle(f"{definition['experiment']}: {definition['algorithm']} search, "
                 f"{len(done)} of {len(trials)} trials completed ({definition['goal']})")
    fig.tight_layout()
    tmp = path.with_name(path.name + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)


def _in_order(values: list[Any]) -> list[str]:
    """Categories as text, in their own order where they have one ((8,) before (32,)), else
    in the text's."""
    try:
        return [repr(v) for v in sorted(set(values))]
    except TypeError:  # unhashable or not comparable
        return sorted({repr(v) for v in values})


def _cell(column: str, value: Any) -> str:
    if value is None:
        return ""
    if column == "wall_sec":
        return f"{value:.1f}"
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _curve_metric(sweep_dir: SweepDir, metric: str, trials: list[Trial]) -> str:
    """The metric whose curves show how the trials learned: the sweep's own, or, where it was
    measured only a few times (an eval at the end), the train metric of that name, else the
    train loss."""
    if not trials or len(metrics.curve(sweep_dir.job_dir(trials[0]), metric)) >= 3:
        return metric
    name = space.metric_parts(metric)[1]
    job = sweep_dir.job_dir(trials[0])
    return f"train {name}" if metrics.curve(job, f"train {name}") else "train loss"


def show(sweep_dir: SweepDir) -> list[list[Any]]:
    """Print the table, write ``results.csv`` and ``results.png``; returns the rows."""
    from rich.console import Console
    from rich.table import Table

    definition, header, table, trials = rows(sweep_dir)
    write_csv(sweep_dir.path / "results.csv", header, table)
    plot(sweep_dir.path / "results.png", sweep_dir, definition, trials)
    view = Table(title=f"{definition['experiment']} sweep: {definition['metric']} "
                       f"({definition['goal']})")
    for name in header:
        view.add_column(name, justify="right" if name not in ("status",) else "left")
    for row in table:
        view.add_row(*[_cell(name, v) for name, v in zip(header, row, strict=True)])
    console = Console(width=max(100, sum(len(h) + 3 for h in header)))
    console.print(view)
    console.print(f"wrote {sweep_dir.path / 'results.csv'} and {sweep_dir.path / 'results.png'}")
    return table
