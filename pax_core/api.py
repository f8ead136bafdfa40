"""Pax from Python: train, evaluate and load a job in a script or a notebook.

Each function does what its command does, through the command's own code
(``pax_core.commands.jobs``): ``train`` is ``pax train``, ``evaluate`` is ``pax eval``, and
``load`` restores a job as ``pax decode`` and the other job commands do. What differs is the
ending: a function returns an object holding the results instead of printing them, and a
mistake is raised (a ``UsageError`` for the caller's to fix, a ``RunError`` for a failure
during the run, ``Stopped`` for a training interrupted and saved) instead of ending the process.
Training prints the same lines as ``pax train`` on stdout (plain lines where stdout is no
terminal, as in a notebook).

Every call builds its plugin host afresh from the installed plugins and the environment
(``PAX_PLUGINS``, ``PAX_DISABLE_PLUGINS``, ``PAX_STRICT_PLUGINS``), as ``pax`` does, unless it
is given one (``host=``: a test's isolated host, say), so nothing one call registers is seen by
the next. Overrides are ``--set``'s: a list of ``KEY=VALUE`` strings, or a mapping of keys to
Python values (each written as its literal).
"""

from __future__ import annotations

import ast
import dataclasses
import os
import time
import types
from collections.abc import Mapping, Sequence
from typing import Any

from pax_core.cli.job_commands import JobRequest, Restored
from pax_core.cli.options import checked_directory
from pax_core.errors import UsageError
from pax_core.plugins.host import PluginHost, PluginSelection

Overrides = Mapping[str, Any] | Sequence[str]


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What ``train`` did: the ``step`` the job reached, the last train summary
    (``train_metrics``: loss, steps_per_sec, ...) and eval results per dataset
    (``eval_metrics``) it logged, the same numbers as the job's ``metrics.jsonl`` holds (empty
    where the call trained nothing: the job had reached its end before), the ``job_dir``, the
    folder of its ``checkpoints`` (the latest is ``step``'s), and the call's ``wall_time_sec``."""

    step: int
    train_metrics: dict[str, float]
    eval_metrics: dict[str, dict[str, float]]
    job_dir: str
    checkpoints: str
    wall_time_sec: float

    @property
    def loss(self) -> float | None:
        """The last train summary's loss, if one was logged."""
        return self.train_metrics.get("loss")


@dataclasses.dataclass(frozen=True)
class EvalResult:
    """What ``evaluate`` found: the checkpoint's ``step`` and the metrics of each eval dataset,
    by dataset name (``metrics["test"]["loss"]``)."""

    step: int
    metrics: dict[str, dict[str, float]]
    job_dir: str


@dataclasses.dataclass
class LoadedJob(Restored):
    """A job restored for use in Python: ``model`` (the task's model), ``variables()`` and
    ``params`` (as the job evaluates: the moving average with ``eval_use_ema_states``), the
    resolved ``config`` (a Fiddle config of the job), its ``experiment`` name, the ``step`` of
    the checkpoint and the ``job_dir``; ``run`` and ``state`` are the run and train state
    (optimizer state included) every job command works from."""

    job_dir: str = ""

    @property
    def params(self) -> Any:
        return self.variables()["params"]

    @property
    def config(self) -> Any:
        return self.run.resolved.config

    @property
    def experiment(self) -> str:
        return self.run.resolved.name


def default_host() -> PluginHost:
    """The host ``pax`` builds: the installed plugins, as the environment selects them."""
    return PluginHost(PluginSelection.from_env())


def set_items(overrides: Overrides) -> list[str]:
    """``overrides`` as ``--set`` items: a mapping's values written as Python literals (a value
    that has none is a ``UsageError`` naming its key)."""
    if isinstance(overrides, str):
        raise UsageError(f"overrides: give a list of KEY=VALUE strings or a dict, not one "
                         f"string ({overrides!r}): overrides=[{overrides!r}]")
    if not isinstance(overrides, Mapping):
        items = list(overrides)
        wrong = [item for item in items if not isinstance(item, str)]
        if wrong:
            raise UsageError(f"overrides: each item of a list is a KEY=VALUE string, got "
                             f"{wrong[0]!r}; or give a dict of keys to values")
        return items
    items = []
    for key, value in overrides.items():
        text = repr(value)
        try:
            same = ast.literal_eval(text) == value
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            same = False
        if not same:
            raise UsageError(f"overrides: the value of {key} ({type(value).__name__}) is not a "
                             f"Python literal; give numbers, strings, lists, tuples, "
                             f"True/False or None")
        items.append(f"{key}={text}")
    return items


def _path(job_dir: str | os.PathLike[str]) -> str:
    """A job directory as the commands take it (``~`` expanded, as a shell would), checked as
    ``--job-dir`` is: neither empty (the current folder) nor a URL without its ``//``."""
    text = os.fspath(job_dir)
    text = text if "://" in text else os.path.expanduser(text)
    # The option's own check, given the name the caller knows the value by.
    return checked_directory(types.SimpleNamespace(opts=["job_dir"]), text)


def train(exp: str | None, job_dir: str | os.PathLike[str], *, plugin: str | None = None,
          overrides: Overrides = (), platform: str | None = None,
          restore_step: int | None = None, evaluate: bool = True,
          peak_tflops: float | None = None, host: PluginHost | None = None) -> TrainResult:
    """Train experiment ``exp`` in ``job_dir``, or resume it from the job's latest checkpoint
    (with ``exp`` None, the experiment and overrides the job recorded): ``pax train``.

    ``restore_step`` restarts from that checkpoint (the later ones are set aside); without
    ``evaluate`` the eval datasets are not evaluated; ``peak_tflops`` is one device's peak for
    MFU."""
    from pax_core.commands.jobs import run_training

    started = time.monotonic()
    where = _path(job_dir)
    trained = run_training(host or default_host(), exp=exp, plugin=plugin,
                           set_items=set_items(overrides), job_dir=where, platform=platform,
                           peak_tflops=peak_tflops, restore_step=restore_step,
                           evaluate=evaluate)
    return TrainResult(trained.step, trained.train_metrics, trained.eval_metrics, where,
                       _checkpoints(where), time.monotonic() - started)


def _checkpoints(job_dir: str) -> str:
    from pax_core.run.jobdir import JobDir

    return str(JobDir(job_dir).checkpoints)


def evaluate(job_dir: str | os.PathLike[str], *, step: int | None = None,
             overrides: Overrides = (), platform: str | None = None,
             host: PluginHost | None = None, exp: str | None = None) -> EvalResult:
    """Evaluate the job's latest checkpoint (or ``step``'s) on its eval datasets: ``pax
    eval``. The job's recorded experiment and overrides, then ``overrides``, configure it;
    ``exp`` names the experiment instead (one a job records only by its file, ``file.py:Class``,
    is named so: reading a job imports registered code alone)."""
    from pax_core.commands.jobs import evaluate as evaluated

    where = _path(job_dir)
    found, metrics = evaluated(host or default_host(), exp=exp, plugin=None,
                               set_items=set_items(overrides), job_dir=where,
                               platform=platform, step=step)
    return EvalResult(found, metrics, where)


def job_request(job_dir: str | os.PathLike[str], *, step: int | None = None,
                overrides: Overrides = (), platform: str | None = None,
                host: PluginHost | None = None, exp: str | None = None) -> JobRequest:
    """The request a job command gets from its options (``--job-dir``, ``--exp``, ``--set``,
    ``--platform``, ``--restore-checkpoint-step``), made from Python arguments: for a
    package's own ``load`` (pax-lm's), which restores through its command's code."""
    return JobRequest(host or default_host(), _path(job_dir), plugin=None, exp=exp,
                      set_items=set_items(overrides), platform=platform, restore_step=step)


def load(job_dir: str | os.PathLike[str], *, step: int | None = None,
         overrides: Overrides = (), platform: str | None = None,
         host: PluginHost | None = None, exp: str | None = None) -> LoadedJob:
    """Restore the job's latest checkpoint (or ``step``'s) with its recorded experiment and
    overrides (then ``overrides``), or with experiment ``exp``, as ``pax decode`` and the other
    job commands do."""
    request = job_request(job_dir, step=step, overrides=overrides, platform=platform, host=host,
                          exp=exp)
    restored = request.restore(object, "a model")
    return LoadedJob(restored.run, restored.state, restored.step, request.job_dir)
