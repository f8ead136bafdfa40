"""``pax plot``: metrics of one or more jobs against the step, in one picture, from each job's
``metrics.jsonl``.

One panel a metric; one colour a job, its train curve solid and each eval dataset's dashed, so
runs compare at a glance (a learning rate against another, a resumed run against its first).
Without ``--metric`` the panels are the loss and the eval metric the jobs' runs watched
(``task.train.eval_metric``, recorded in each run's start record).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pax_core.errors import UsageError
from pax_core.files import job_path
from pax_core.loggers.base import watched_metric
from pax_core.loggers.jsonl import read_records

FORMATS = (".png", ".svg", ".pdf")
_NOT_METRICS = ("step", "kind", "time")


def plot_jobs(job_dirs: Sequence[str], output: str, metrics: Sequence[str] = ()) -> list[str]:
    """Draw ``metrics`` (names such as ``loss``, or ``KIND NAME`` such as ``eval/test
    accuracy`` for one kind) of ``job_dirs`` into ``output``; the metrics drawn."""
    if Path(output).suffix.lower() not in FORMATS:
        raise UsageError(f"--output {output} must end in {', '.join(FORMATS)} (the picture's "
                         f"format)")
    if not Path(output).resolve().parent.is_dir():
        raise UsageError(f"--output {output}: its folder does not exist")
    jobs = {_label(d, job_dirs): _records(d) for d in job_dirs}
    chosen = list(metrics) or _default_metrics(jobs)
    for metric in chosen:
        if not any(_curves(records, metric) for records in jobs.values()):
            known = sorted({name for records in jobs.values() for r in records
                            if r["kind"] != "start" for name in r if name not in _NOT_METRICS})
            raise UsageError(f"no job logged the metric '{metric}'; they logged: "
                             f"{', '.join(known)}")
    _draw(jobs, chosen, output)
    return chosen


def _records(job_dir: str) -> list[dict[str, Any]]:
    if not job_path(job_dir).is_dir():
        raise UsageError(f"{job_dir} is not a job directory")
    records = read_records(job_dir)
    if not any(r["kind"] != "start" for r in records):
        raise UsageError(f"{job_dir} has no metrics yet ({job_dir}/metrics.jsonl holds none: "
                         f"a job logs them with the jsonl logger, at its first summary)")
    return records


def _label(job_dir: str, job_dirs: Sequence[str]) -> str:
    """A job's name in the legend: its folder's, or the whole path where two share one."""
    name = os.path.basename(os.path.normpath(job_dir))
    same = [d for d in job_dirs if os.path.basename(os.path.normpath(d)) == name]
    return name if len(same) == 1 else job_dir


def _default_metrics(jobs: dict[str, list[dict[str, Any]]]) -> list[str]:
    chosen = ["loss"]
    for records in jobs.values():
        for record in records:
            watched = watched_metric(record) if record["kind"] == "start" else None
            if watched is not None and watched[1] not in chosen:
                chosen.append(watched[1])
    return chosen


def _curves(records: list[dict[str, Any]], metric: str) -> dict[str, list[tuple[int, float]]]:
    """Kind -> (step, value) points of ``metric`` (every kind's, or the one it names)."""
    kind, _, name = metric.rpartition(" ")
    curves: dict[str, list[tuple[int, float]]] = {}
    for record in sorted(records, key=lambda r: r["step"]):
        value = record.get(name)
        if record["kind"] != "start" and (not kind or record["kind"] == kind) and \
                isinstance(value, int | float) and not isinstance(value, bool):
            curves.setdefault(record["kind"], []).append((record["step"], float(value)))
    return curves


def _draw(jobs: dict[str, list[dict[str, Any]]], metrics: list[str], output: str) -> None:
    try:
        import matplotlib
    except ImportError:
        raise UsageError("pax plot draws with matplotlib, which is not installed: "
                         "pip install 'pax-core[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(metrics), figsize=(5.2 * len(metrics), 3.8), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, metric in zip(axes[0], metrics, strict=True):
        for index, (job, records) in enumerate(jobs.items()):
            for kind, points in _curves(records, metric).items():
                ax.plot([s for s, _ in points], [v for _, v in points],
                        color=colours[index % len(colours)],
                        linestyle="-" if kind == "train" else "--",
                        marker="." if len(points) < 30 else None, label=f"{job} {kind}")
        ax.set_title(metric)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    suffix = Path(output).suffix
    partial = f"{output}.partial{suffix}"  # written whole, then put in place
    fig.savefig(partial, dpi=110)
    plt.close(fig)
    os.replace(partial, output)
