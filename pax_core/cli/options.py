"""The options ``pax`` commands share, as ``Annotated`` types a plugin's command reuses.

A plugin command that takes a job directory or an experiment declares its parameters with these
(``job_dir: JobDirOpt``), so that every command spells and documents them alike.
"""

from __future__ import annotations

from typing import Annotated

import typer

PluginOpt = Annotated[str | None, typer.Option(
    "--plugin", "-p", metavar="PLUGIN",
    help="Look the experiment up in this plugin only (it must load; its import error is shown "
    "if it does not).")]
ExpOpt = Annotated[str, typer.Option(
    "--exp", "-e", metavar="EXPERIMENT",
    help="Experiment: a registered name, plugin/name, a dotted path or suffix (Pax's "
    "tasks.lm.params.…), or module:Class / file.py:Class.")]
RecordedExpOpt = Annotated[str | None, typer.Option(
    "--exp", "-e", metavar="EXPERIMENT",
    help="Experiment; default: the one recorded in --job-dir.")]
SetOpt = Annotated[list[str] | None, typer.Option(
    "--set", "-s", metavar="KEY=VALUE",
    help="Override an experiment constant (NUM_LAYERS=4) or a config path "
    "(task.model.num_layers=4); repeatable. Pax's --fdl.KEY=VALUE is accepted too.")]
JobDirOpt = Annotated[str, typer.Option(
    "--job-dir", "-j", metavar="DIR",
    help="Directory for the config, checkpoints and metrics. Running again in the same "
    "directory resumes.")]
PlatformOpt = Annotated[str | None, typer.Option(
    "--platform", metavar="PLATFORM",
    help="cpu, gpu or tpu; default: JAX_PLATFORMS, else what JAX finds.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
RestoreStepOpt = Annotated[int | None, typer.Option(
    "--restore-checkpoint-step", metavar="STEP", min=0,
    help="Use the checkpoint of this step instead of the latest (Pax's "
    "--restore_checkpoint_step).")]
AddressOpt = Annotated[str | None, typer.Option(
    "--coordinator-address", metavar="HOST:PORT",
    help="Multi-process run: process 0's host and a free port, the same on every process. "
    "Same as PAX_COORDINATOR_ADDRESS.")]
NumProcessesOpt = Annotated[str | None, typer.Option(
    "--num-processes", metavar="N",
    help="Multi-process run: how many processes (1: one, whatever the environment says). "
    "Same as PAX_NUM_PROCESSES.")]
ProcessIdOpt = Annotated[str | None, typer.Option(
    "--process-id", metavar="I",
    help="Multi-process run: this process's index, 0 to N-1. Same as PAX_PROCESS_ID.")]
