"""Pax core: the plugin host, the ``pax`` command and the training loop.

The names exported here are Pax's plugin API, version ``API_VERSION``: everything a plugin
package needs, and the only names plugins import (``from pax_core import Experiment, hookimpl``).
Modules below ``pax_core`` are the core's own business and may move between releases; these
names do not, except through a deprecation (below). ``pax_core.testing`` is the API's companion
for plugin tests. ``train``, ``evaluate`` and ``load`` are Pax from Python, for scripts and
notebooks (``pax_core.api``).

Every name is imported on first use (PEP 562), so ``import pax_core`` stays free of JAX: the
command line lists plugins and prints help without starting an accelerator runtime.

Versioning is semantic: a new name is a minor version, a removed or changed one a major
version. A renamed name keeps answering for one minor version under its old spelling, with a
``DeprecationWarning`` naming its replacement (``_DEPRECATED``).
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

__version__ = "0.1.0"
API_VERSION = "1.22.0"

# Public name -> the module that defines it.
_EXPORTS: dict[str, str] = {
    # plugin host
    "hookimpl": "pax_core.plugins.hookspecs",
    "public_face": "pax_core.faces",
    "Component": "pax_core.plugins.records",
    "ExperimentRef": "pax_core.plugins.records",
    "RunInfo": "pax_core.plugins.notify",
    # experiments and their configuration
    "Experiment": "pax_core.config.experiment",
    "SingleTaskExperiment": "pax_core.config.single_task",
    "Task": "pax_core.config.task",
    "Train": "pax_core.config.task",
    "Learner": "pax_core.config.task",
    "EarlyStopping": "pax_core.config.task",
    "Job": "pax_core.config.task",
    "Optimizer": "pax_core.config.optimizers",
    "Adam": "pax_core.config.optimizers",
    "Adafactor": "pax_core.config.optimizers",
    "Lion": "pax_core.config.optimizers",
    "Sgd": "pax_core.config.optimizers",
    "Constant": "pax_core.config.schedules",
    "LinearRampupExponentialDecay": "pax_core.config.schedules",
    "LinearRampupCosineDecay": "pax_core.config.schedules",
    "LinearRampupPiecewiseConstant": "pax_core.config.schedules",
    # interfaces a plugin implements, and the built-ins it may reuse
    "ModelOutput": "pax_core.models.output",
    "MlpClassifier": "pax_core.models.mlp",
    "Input": "pax_core.inputs.base",
    "IndexedInput": "pax_core.inputs.indexed",
    "fingerprint": "pax_core.inputs.indexed",
    "SyntheticInput": "pax_core.inputs.synthetic",
    "parse_tf_example": "pax_core.inputs.tfds",
    "make_tf_example": "pax_core.inputs.tfds",
    "tfds_split_files": "pax_core.inputs.tfds",
    "Logger": "pax_core.loggers.base",
    "Checkpointer": "pax_core.checkpointers.base",
    "CheckpointSettings": "pax_core.checkpointers.base",
    "Weights": "pax_core.checkpointers.base",
    "WeightFormat": "pax_core.models.weight_format",
    "SourceModel": "pax_core.models.weight_format",
    "key_paths": "pax_core.models.weight_format",
    "DamagedCheckpoint": "pax_core.checkpointers.integrity",
    "Partitioner": "pax_core.parallel.partitioner",
    "Reduction": "pax_core.parallel.partitioner",
    "Spmd": "pax_core.parallel.spmd",
    "mean_across_shards": "pax_core.parallel.partitioner",
    "Backend": "pax_core.backends.base",
    "CpuBackend": "pax_core.backends.cpu",
    "TpuBackend": "pax_core.backends.tpu",
    "Preset": "pax_core.backends.presets",
    "apply_presets": "pax_core.backends.presets",
    "parse_flags": "pax_core.backends.presets",
    "dot_product_attention": "pax_core.backends.attention",
    "ATTENTION_RESIDUALS": "pax_core.backends.base",
    "MeshLayout": "pax_core.parallel.layouts",
    "DistributedOptions": "pax_core.parallel.processes",
    "axes": "pax_core.axes",
    # errors
    "PaxError": "pax_core.errors",
    "UsageError": "pax_core.errors",
    "RunError": "pax_core.errors",
    "Stopped": "pax_core.errors",
    "warn": "pax_core.errors",
    # what a command of a plugin builds on: the host, experiments by name, the backends, and
    # files written whole and folders held by one process
    "PluginHost": "pax_core.plugins.host",
    "choose_experiment": "pax_core.config.resolve",
    "platform_backends": "pax_core.run.runtime",
    "accelerator_platform": "pax_core.run.runtime",
    "write_atomic": "pax_core.files",
    "held": "pax_core.files",
    "is_held": "pax_core.files",
    # commands that use a trained job, and the options they share with `pax train`
    "Run": "pax_core.run.build",
    "TrainState": "pax_core.run.state",
    "restore_latest": "pax_core.commands.jobs",
    "job_command": "pax_core.cli.job_commands",
    "JobRequest": "pax_core.cli.job_commands",
    "Restored": "pax_core.cli.job_commands",
    "require_files": "pax_core.cli.job_commands",
    "ExpOpt": "pax_core.cli.options",
    "JobDirOpt": "pax_core.cli.options",
    "JsonOpt": "pax_core.cli.options",
    "PlatformOpt": "pax_core.cli.options",
    "PluginOpt": "pax_core.cli.options",
    "RecordedExpOpt": "pax_core.cli.options",
    "RestoreStepOpt": "pax_core.cli.options",
    "SetOpt": "pax_core.cli.options",
    # Pax from Python: train, evaluate and load a job in a script or a notebook
    "train": "pax_core.api",
    "evaluate": "pax_core.api",
    "load": "pax_core.api",
    "job_request": "pax_core.api",
    "TrainResult": "pax_core.api",
    "EvalResult": "pax_core.api",
    "LoadedJob": "pax_core.api",
}

# Old name -> (new name, the API version that removes the old one).
_DEPRECATED: dict[str, tuple[str, str]] = {}
# A name moved to a plugin package -> (that package, the API version that removes it here).
_MOVED: dict[str, tuple[str, str]] = {}

__all__ = sorted(["API_VERSION", "__version__", *_EXPORTS])


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        package, removed_in = _MOVED[name]
        install = f"pip install {package.replace('_', '-')}"
        warnings.warn(f"pax_core.{name} moved to {package} and goes away here in API "
                      f"{removed_in}; use {package}.{name} ({install})", DeprecationWarning,
                      stacklevel=2)
        try:
            return getattr(importlib.import_module(package), name)
        except ModuleNotFoundError as e:
            if e.name != package:
                raise
            raise AttributeError(f"pax_core.{name} moved to {package}, which is not "
                                 f"installed: {install}") from None
    if name in _DEPRECATED:
        new, removed_in = _DEPRECATED[name]
        warnings.warn(f"pax_core.{name} is deprecated and goes away in API {removed_in}; use "
                      f"pax_core.{new}", DeprecationWarning, stacklevel=2)
        return __getattr__(new)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pax_core' has no attribute {name!r}")
    if name == "axes":
        return importlib.import_module(module)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
