"""The skeleton of a command that uses a trained job: ``pax decode``, ``pax predict``,
``pax transcribe``, and a plugin's own.

Each such command takes the same options (the job directory, and the experiment, overrides,
platform and checkpoint step to restore with), checks its own arguments before anything slow
happens, restores the job's latest state, refuses a model of another kind by name, and prints
one line per result, from process 0 only (every process of a multi-process job computes the
same). A plugin writes the part that is its own::

    @job_command
    def predict(job: JobRequest, images: Annotated[list[Path], typer.Argument()]) -> None:
        require_files(images, "image")
        restored = job.restore(ImageClassifier, "an image classifier")
        ...
        restored.echo(f"{path}: {classes}")

and registers the typer app ``job_command`` returns.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer

from pax_core.cli.options import (
    JobDirOpt,
    PlatformOpt,
    PluginOpt,
    RecordedExpOpt,
    RestoreStepOpt,
    SetOpt,
    context_settings,
    summary,
)
from pax_core.errors import UsageError


@dataclasses.dataclass
class Restored:
    """A job's state restored for use: the run (its model, inputs, partitioner), the state, and
    the step it was saved at."""

    run: Any
    state: Any
    step: int

    @property
    def model(self) -> Any:
        return self.run.task.model

    def variables(self) -> Any:
        """The variables to run the model with: the parameters (their moving average when the
        job evaluates with it) and the model's other collections."""
        return self.run.eval_variables(self.state)

    def echo(self, text: str) -> None:
        """Print ``[step N] text`` once, from process 0."""
        import jax

        if jax.process_index() == 0:
            typer.echo(f"[step {self.step}] {text}")


@dataclasses.dataclass
class JobRequest:
    """Which job to restore, and how: the options every job command takes."""

    host: Any
    job_dir: str
    plugin: str | None
    exp: str | None
    set_items: list[str]
    platform: str | None
    restore_step: int | None

    def restore(self, model_type: type, kind: str) -> Restored:
        """Restore the job; a model that is not a ``model_type`` is refused, naming ``kind``
        ("a speech recognizer")."""
        from pax_core.commands.jobs import restore_latest

        run, state, step = restore_latest(
            self.host, exp=self.exp, plugin=self.plugin, set_items=self.set_items,
            job_dir=self.job_dir, platform=self.platform, step=self.restore_step)
        if not isinstance(run.task.model, model_type):
            raise UsageError(f"experiment {run.resolved.name} is not {kind}")
        return Restored(run, state, step)


def require_files(paths: Sequence[Path], kind: str) -> None:
    """A usage error naming every one of ``paths`` that is not a file."""
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise UsageError(f"no such {kind} file: {', '.join(missing)}")


_SHARED = [
    inspect.Parameter("job_dir", inspect.Parameter.KEYWORD_ONLY, annotation=JobDirOpt),
    inspect.Parameter("plugin", inspect.Parameter.KEYWORD_ONLY, annotation=PluginOpt,
                      default=None),
    inspect.Parameter("exp", inspect.Parameter.KEYWORD_ONLY, annotation=RecordedExpOpt,
                      default=None),
    inspect.Parameter("set_items", inspect.Parameter.KEYWORD_ONLY, annotation=SetOpt,
                      default=None),
    inspect.Parameter("platform", inspect.Parameter.KEYWORD_ONLY, annotation=PlatformOpt,
                      default=None),
    inspect.Parameter("restore_step", inspect.Parameter.KEYWORD_ONLY, annotation=RestoreStepOpt,
                      default=None),
]


def job_command(command: Callable[..., None]) -> typer.Typer:
    """A typer app of one command: ``command(job, ...)`` with its own arguments and options,
    and the shared ones gathered into ``job`` (a ``JobRequest``)."""
    own = list(inspect.signature(command, eval_str=True).parameters.values())[1:]
    context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                annotation=typer.Context)

    def run(ctx: typer.Context, **options: Any) -> None:
        shared = {p.name: options.pop(p.name) for p in _SHARED}
        shared["set_items"] = list(shared["set_items"] or [])
        command(JobRequest(ctx.obj, **shared), **options)

    parameters = [context, *_SHARED, *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
                                       for p in own)]
    run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    run.__annotations__ = {p.name: p.annotation for p in parameters}
    run.__name__, run.__doc__ = command.__name__, command.__doc__

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                      context_settings=context_settings())
    app.command(short_help=summary(command))(run)
    return app
