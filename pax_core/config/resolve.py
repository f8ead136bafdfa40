"""From what the user typed to a validated configuration: experiment, overrides, build.

Everything here happens before the job directory is touched, so a mistake ends with a
``UsageError`` and nothing written.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from typing import Any

import fiddle as fdl
from fiddle import printing
from fiddle.experimental import serialization

from pax_core.config import lookup, overrides
from pax_core.config.experiment import Experiment
from pax_core.config.task import Job
from pax_core.errors import PaxError, UsageError, first_line, warn
from pax_core.files import job_path
from pax_core.plugins.host import PluginHost


@dataclasses.dataclass
class ChosenExperiment:
    """An experiment found by name with the user's constant overrides applied: enough to start
    the runtime (its mesh and layout), before its config is made."""

    name: str
    experiment: Experiment
    overrides: list[overrides.Override]


@dataclasses.dataclass
class ResolvedExperiment:
    """An experiment with the user's overrides applied, ready to build."""

    name: str
    experiment: Experiment
    config: fdl.Config
    overrides: list[str]

    def build(self) -> Job:
        """Build the objects; a config that cannot build is the user's to fix (exit 2)."""
        try:
            job = fdl.build(self.config)
        except PaxError as e:
            # Fiddle re-raises through a proxy that appends its context to the message; Pax's
            # own errors stay one line, so raise the original.
            raise getattr(e, "proxy_base_exception", e) from None
        except Exception as e:
            raise UsageError(f"the config of {self.name} does not build: "
                             f"{type(e).__name__}: {e}".splitlines()[0]) from e
        _check_datasets(self.name, job.datasets)
        return job

    def to_json(self) -> str:
        return serialization.dump_json(self.config, indent=1) + "\n"

    def to_text(self) -> str:
        lines = printing.as_str_flattened(self.config, include_types=False).splitlines()
        return "\n".join(line for line in lines if "<[unset" not in line) + "\n"


def _check_datasets(name: str, datasets: list[Any]) -> None:
    training = [d for d in datasets if getattr(d, "is_training", False)]
    if len(training) != 1:
        raise UsageError(f"experiment {name} must declare exactly one dataset with "
                         f"is_training=True in datasets(); it has {len(training)}")
    names = [getattr(d, "name", "") for d in datasets]
    if len(set(names)) != len(names):
        raise UsageError(f"experiment {name}: dataset names must be unique, got {names}")


def _check_required_plugins(name: str, cls: type[Experiment]) -> None:
    for distribution in cls.REQUIRED_PLUGINS:
        try:
            importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            raise UsageError(f"experiment {name} needs the {distribution} plugin, which is not "
                             f"installed (pip install {distribution})") from None


def load_config(path: str) -> fdl.Config:
    """A job's config from a Fiddle JSON file (``config.json``), or a ``UsageError`` naming the
    file and what is wrong with it."""
    try:
        text = job_path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"config file {path} cannot be read: "
                         f"{getattr(e, 'strerror', None) or e}") from None
    try:
        config = serialization.load_json(text)
    except Exception as e:
        what = first_line(e)
        raise UsageError(f"config file {path} is not a Fiddle config written by pax "
                         f"train ({what}); use a job's config.json, or repair it") from None
    if not isinstance(config, fdl.Config) or fdl.get_callable(config) is not Job:
        raise UsageError(f"config file {path} holds a Fiddle config, but not of a job "
                         f"(a Job with a task and datasets); use a job's config.json")
    return config


def experiment_class(host: PluginHost, exp: str, plugin: str | None,
                     set_items: list[str]) -> tuple[str, type[Experiment]]:
    """``exp``'s name and class with the ``--set`` overrides of its constants applied: what
    its constants say (its mesh) without building anything."""
    if plugin:
        host.require(plugin)
    name, cls = lookup.find_experiment(host.components("experiments"), exp, plugin)
    _check_required_plugins(name, cls)
    parsed = overrides.parse(set_items)
    return name, overrides.apply_constants(cls, [o for o in parsed if o.is_constant])


def choose_experiment(host: PluginHost, exp: str, plugin: str | None,
                      set_items: list[str]) -> ChosenExperiment:
    """Look up ``exp`` and apply the ``--set`` overrides of its constants (those of config
    paths are parsed, and applied by ``configure``)."""
    name, cls = experiment_class(host, exp, plugin, set_items)
    parsed = overrides.parse(set_items)
    unread = getattr(cls, "unread_constants", None)
    if unread:
        aliases = cls.aliases()
        for key in unread([aliases.get(o.key, o.key) for o in parsed if o.is_constant]):
            warn(f"--set {key} changes nothing: experiment {name} trains with OPTIMIZER "
                 f"{cls.OPTIMIZER} and LR_SCHEDULE {cls.LR_SCHEDULE}, which do not read it")
    return ChosenExperiment(name, cls(), parsed)


def configure(chosen: ChosenExperiment, config_file: str | None = None) -> ResolvedExperiment:
    """The config tree (not the objects) of a chosen experiment, with the path overrides.

    An experiment may ask JAX about the devices while it makes its config (Pax's global batch
    is ``PERCORE_BATCH_SIZE`` x ``jax.device_count()``), which starts JAX: a run therefore
    calls this only once its runtime has started (presets applied, processes joined).

    With ``config_file`` (Pax's ``--fdl_config_file``) its config replaces the experiment's
    task and datasets; the experiment's constants still give the mesh and the components, and
    path overrides apply to the file's config."""
    name, experiment, parsed = chosen.name, chosen.experiment, chosen.overrides
    try:
        config = (load_config(config_file) if config_file else
                  fdl.Config(Job, task=experiment.task(), datasets=list(experiment.datasets())))
    except PaxError:
        raise
    except Exception as e:
        raise UsageError(f"experiment {name} could not make its config: "
                         f"{type(e).__name__}: {e}") from e
    for ov in parsed:
        if not ov.is_constant:
            overrides.apply_path(config, ov)
    return ResolvedExperiment(name, experiment, config, [str(o) for o in parsed])


def resolve(host: PluginHost, exp: str, plugin: str | None, set_items: list[str],
            config_file: str | None = None) -> ResolvedExperiment:
    """Look up ``exp``, apply ``--set`` overrides, and build the config tree (not the objects):
    ``choose_experiment`` then ``configure``."""
    return configure(choose_experiment(host, exp, plugin, set_items), config_file)
