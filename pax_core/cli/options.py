"""The options ``pax`` commands share, as ``Annotated`` types a plugin's command reuses.

A plugin command that takes a job directory or an experiment declares its parameters with these
(``job_dir: JobDirOpt``), so that every command spells and documents them alike.
"""

from __future__ import annotations

import inspect
import re
import shutil
from collections.abc import Callable
from typing import Annotated, Any

import typer

from pax_core.errors import UsageError

# A first path component such as ``gs:`` or ``s3:``: a URL whose ``//`` is missing, not a folder.
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def checked_directory(param: typer.CallbackParam, value: str | None) -> str | None:
    """A directory option's value, unless it would put the job somewhere the user did not mean:
    an empty one would be the current folder, and ``gs:/bucket`` (one slash) a local folder
    named ``gs:``. Raised as a ``UsageError`` (one line, exit 2) before anything is written."""
    if value is None:
        return None
    option = max(param.opts, key=len)
    if not value.strip():
        raise UsageError(f"{option} is empty; give a directory's path (nothing was changed)")
    first = value.split("/", 1)[0]
    if _SCHEME.fullmatch(first) and not value.startswith(first + "//"):
        raise UsageError(f"{option} {value} looks like a URL without its '//'; a bucket is "
                         f"written gs://BUCKET/PATH (nothing was changed)")
    return value


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
    "--job-dir", "-j", metavar="DIR", callback=checked_directory,
    help="Directory for the config, checkpoints and metrics. Running again in the same "
    "directory resumes.")]
PlatformOpt = Annotated[str | None, typer.Option(
    "--platform", metavar="PLATFORM",
    help="cpu, gpu or tpu; default: JAX_PLATFORMS, else what JAX finds.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
FORMATS = ("table", "tsv", "json")


def checked_format(value: str | None) -> str | None:
    """``--format``'s value, one of ``FORMATS``; anything else is a usage mistake (exit 2)."""
    if value is not None and value not in FORMATS:
        raise UsageError(f"--format {value}: expected one of {', '.join(FORMATS)}")
    return value


FormatOpt = Annotated[str | None, typer.Option(
    "--format", metavar="table|tsv|json", callback=checked_format,
    help="table, tsv or json; default: a table on a terminal, tab-separated rows (a header "
    "line first) when the output is piped or redirected.")]
JsonAliasOpt = Annotated[bool, typer.Option("--json", help="Same as --format json.")]
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


def context_settings() -> dict[str, Any]:
    """What every ``pax`` command's context starts from: ``-h`` beside ``--help``, and help as
    wide as the terminal (``COLUMNS`` where set) rather than click's 80 columns."""
    return {"help_option_names": ["-h", "--help"],
            "max_content_width": shutil.get_terminal_size().columns}


def summary(function: Callable[..., Any]) -> str:
    """A command's one-line summary in ``pax --help``: the first paragraph of its docstring,
    whole (click would cut it to fit 45 columns at 80)."""
    return " ".join(inspect.cleandoc(function.__doc__ or "").split("\n\n")[0].split())
