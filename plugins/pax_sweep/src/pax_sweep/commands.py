"""``pax sweep``: the command line of a sweep (``driver``) and of its results (``results``).

pax-sweep registers it through ``pax_register_commands``; the host the command runs with is the
typer context's object, as for every plugin command.
"""

from __future__ import annotations

from typing import Annotated

import typer

from pax_core import PlatformOpt, PluginOpt, SetOpt
from pax_sweep import driver, results
from pax_sweep.record import SweepDir


def sweep(
    ctx: typer.Context,
    sweep_dir: Annotated[str, typer.Option(
        "--sweep-dir", "-d", metavar="DIR",
        help="The sweep's folder: its record, and each trial's job under trials/NNN. The "
        "same command in the same folder resumes.")],
    exp: Annotated[str | None, typer.Option(
        "--exp", "-e", metavar="EXPERIMENT",
        help="Experiment to tune (as pax train takes it); not needed with --show.")] = None,
    plugin: PluginOpt = None,
    set_items: SetOpt = None,
    search: Annotated[list[str] | None, typer.Option(
        "--search", metavar="KEY=EXPR",
        help="Search KEY (a constant or config path, as --set takes it) over oneof([...]), "
        "floatv(LOW, HIGH[, log]), intv(LOW, HIGH) or manyof(K, [...]); repeatable; added to "
        "the experiment's search() (a key given here replaces its own).")] = None,
    search_file: Annotated[list[str] | None, typer.Option(
        "--search-file", metavar="FILE",
        help="KEY=EXPR lines (# comments), as --search.")] = None,
    metric: Annotated[str | None, typer.Option(
        "--metric", metavar="METRIC",
        help="The metric that judges a trial, its last value, as KIND NAME: 'eval/test loss', "
        "'eval/heldout log_pplx'; default: the experiment's search().")] = None,
    goal: Annotated[str | None, typer.Option(
        "--goal", metavar="minimize|maximize",
        help="Whether lower or higher is better; default: the experiment's search(), "
        "else minimize.")] = None,
    early_stop: Annotated[list[str] | None, typer.Option(
        "--early-stop", metavar="STEP:FRACTION",
        help="Stop at STEP a trial whose metric there is outside the best FRACTION of the "
        "trials that reached STEP (once 3 have); repeatable.")] = None,
    algorithm: Annotated[str, typer.Option(
        "--algorithm", metavar="NAME",
        help="grid, random, evolution (PyGlove's regularized evolution) or vizier (OSS "
        "Vizier's GP bandit: pax-sweep[vizier]).")] = "random",
    trials: Annotated[int | None, typer.Option(
        "--trials", metavar="N", min=1,
        help="Trials in all (a resumed sweep may be given more); default: the experiment's, "
        "else the whole grid or 16.")] = None,
    parallel: Annotated[int, typer.Option(
        "--parallel", metavar="K", min=1,
        help="Trials at once, each with its share of the devices.")] = 1,
    runner: Annotated[str, typer.Option(
        "--runner", metavar="NAME",
        help="Where trials train: local (this machine), or a plugin's.")] = "local",
    seed: Annotated[int, typer.Option("--seed", help="The algorithm's random seed.")] = 0,
    platform: PlatformOpt = None,
    show: Annotated[bool, typer.Option(
        "--show", help="Print the trials sorted by the metric and write results.csv and "
        "results.png into the sweep's folder; trains nothing.")] = False,
) -> None:
    """Tune an experiment: trials proposed by a PyGlove algorithm, each a pax train job.

    Ctrl-C stops the running trials (each saves its checkpoint); the same command resumes,
    running no finished trial again.
    """
    if not show:
        if exp is None:
            raise typer.BadParameter("give the experiment to tune", param_hint="--exp")
        driver.sweep(ctx.obj, driver.SweepOptions(
            exp=exp, sweep_dir=sweep_dir, plugin=plugin, set_items=tuple(set_items or ()),
            search_items=tuple(search or ()), search_files=tuple(search_file or ()),
            metric=metric, goal=goal, early_stop=tuple(early_stop or ()), algorithm=algorithm,
            trials=trials, parallel=parallel, runner=runner, seed=seed, platform=platform))
    results.show(SweepDir(sweep_dir))
