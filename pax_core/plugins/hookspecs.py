"""Every hook a Pax plugin can implement: this module is their reference documentation.

A plugin is a module (named by an entry point in the ``pax`` group) with functions decorated by
``pax_core.hookimpl``::

    # pyproject.toml
    [project.entry-points.pax]
    lm = "pax_lm.plugin"

    # pax_lm/plugin.py
    from pax_core import hookimpl
    from pax_core.plugins.records import Component

    @hookimpl
    def pax_register_models():
        return [Component("transformer_lm", "pax_lm.model:TransformerLm", "decoder-only LM")]

Keep the plugin module small: ``pax plugins`` and ``pax --help`` import it, so it should import
nothing heavier than ``pax_core.plugins.records``. Factories are ``"module:attribute"`` strings and are
imported only when a run uses them.

Two families of hooks:

* **Registration** (``pax_register_*``): each returns a list of records and is called once per
  plugin, so every record is attributed to the plugin that returned it. None of them is
  ``firstresult``. A short name registered by two plugins is an error when used (it names both
  distributions); ``plugin/name`` always works; a plugin's name wins over a built-in's.
* **Notifications** (``pax_on_*``): told about a run's life cycle. They return nothing. A plugin
  that raises inside one is reported as a warning and the run goes on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from pax_core.plugins.notify import RunInfo
    from pax_core.plugins.records import Component, ExperimentRef

PROJECT = "pax"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def pax_register_models() -> list[Component]:
    """Register model factories.

    Returns a list of ``Component`` records. The factory is a Flax ``linen.Module`` class (or a
    function returning one) whose ``__call__(batch: dict[str, Array])`` returns a
    ``pax_core.models.output.ModelOutput`` (the loss to minimise, weighted metrics, and the number of
    tokens the batch held). Optionally it counts its own training FLOPs for MFU:
    ``flops_per_step(batch_spec) -> float`` and a versioned ``flops_formula`` name (see
    ``pax_core.models.output``). An experiment usually configures the class directly with
    ``fdl.Config(MyModel, ...)``; the registered name makes it listable and buildable by name
    (``pax_core.plugins.host.PluginHost.components("models").get("mlp").build(...)``).

    Example::

        @hookimpl
        def pax_register_models():
            return [Component("mlp", "pax_core.models.mlp:MlpClassifier", "dense classifier")]
    """


@hookspec
def pax_register_partitioners() -> list[Component]:
    """Register partitioners: strategies that place a run on the device mesh.

    The factory takes no arguments and returns a ``pax_core.parallel.partitioner.Partitioner``. It builds
    the mesh from the experiment's declaration, gives the shardings of the train state and of a
    batch, and turns each process's batch into global arrays. Chosen by the experiment's
    ``PARTITIONER`` constant (``--set PARTITIONER=name``). Built in: ``data_parallel``.

    Example::

        @hookimpl
        def pax_register_partitioners():
            return [Component("pipeline", "pax_pipeline.partitioner:Pipeline", "GPipe stages")]
    """


@hookspec
def pax_register_inputs() -> list[Component]:
    """Register input pipelines.

    The factory is called with the keyword arguments of the experiment's dataset config and
    returns a ``pax_core.inputs.Input``: an iterator over this process's share of each global
    batch (a dict of numpy arrays) that can save and restore its position. Built in:
    ``synthetic``.

    Example::

        @hookimpl
        def pax_register_inputs():
            return [Component("text", "pax_lm.inputs:TextInput", "packed text from files")]
    """


@hookspec
def pax_register_checkpointers() -> list[Component]:
    """Register checkpoint back ends.

    The factory is called as ``factory(directory: str, settings: CheckpointSettings)`` and returns
    a ``pax_core.checkpointers.base.Checkpointer`` (save a step, restore the latest onto given
    shardings, wait, close). A save must never leave a half-written step behind. Chosen by the
    experiment's ``CHECKPOINTER`` constant. Built in: ``orbax``.
    """


@hookspec
def pax_register_loggers() -> list[Component]:
    """Register metric sinks.

    The factory is called as ``factory(job_dir: str)`` and returns a
    ``pax_core.loggers.Logger``. The loop hands it host-side floats at summary and eval steps; a
    logger must not block the loop for long. Chosen by the experiment's ``LOGGERS`` constant
    (``--set "LOGGERS=('console','jsonl')"``). Built in: ``console``, ``jsonl``, ``tensorboard``.
    """


@hookspec
def pax_register_experiments() -> list[ExperimentRef]:
    """Register experiment classes.

    Returns ``ExperimentRef`` records: the experiment's name, its class as ``"module:Class"``,
    and ``aliases`` (full dotted names users already know, such as Pax's
    ``tasks.lm.params.lm_cloud.LmCloudSpmd2B``). Look-up accepts the name, ``plugin/name``, any
    unique dotted suffix of the class path or an alias. The class derives from
    ``pax_core.config.experiment.Experiment``.

    Example::

        @hookimpl
        def pax_register_experiments():
            return [ExperimentRef("LmCloudSpmd2B", "pax_lm.experiments.lm_cloud:LmCloudSpmd2B",
                                  aliases=("tasks.lm.params.lm_cloud.LmCloudSpmd2B",))]
    """


@hookspec
def pax_register_backends() -> list[Component]:
    """Register runtime set-up for a platform, named as JAX names it (``cpu``, ``gpu``, ``tpu``;
    ``cuda`` and ``rocm`` count as ``gpu``).

    The factory takes no arguments and returns a ``pax_core.backends.base.Backend``: ``prepare()``
    runs before JAX starts its runtime (environment variables, XLA flags) and must touch only its
    own platform's settings; ``check(devices)`` runs after, on the platform JAX picked (refuse
    unusable devices with a ``UsageError``). With ``--platform`` or ``JAX_PLATFORMS`` only that
    platform's backend prepares; otherwise every installed one does, since the platform is known
    only once JAX has started. A platform without a backend runs with JAX's defaults. Built in:
    ``cpu``.
    """


@hookspec
def pax_register_commands() -> list[Component]:
    """Register extra ``pax`` subcommands.

    The factory is a ``typer.Typer`` app (or a plain function, wrapped into one); it is imported
    only when the subcommand runs, so ``help`` is what ``pax --help`` shows.

    Example::

        @hookimpl
        def pax_register_commands():
            return [Component("decode", "pax_lm.decode_cli:app", "sample text from a job")]
    """


@hookspec
def pax_on_train_start(run: RunInfo) -> None:
    """Called once the train state is ready, before the first step of this invocation.

    ``run.start_step`` is the restored step (0 for a fresh run).
    """


@hookspec
def pax_on_metrics(run: RunInfo, step: int, kind: str, metrics: dict[str, Any]) -> None:
    """Called with host-side metric values at summary steps (``kind="train"``) and after each
    eval (``kind="eval/<dataset>"``). Values are Python floats."""


@hookspec
def pax_on_checkpoint_saved(run: RunInfo, step: int, directory: str) -> None:
    """Called once the checkpoint of ``step`` is committed under ``directory`` (saves are
    asynchronous: this comes when the next save starts, or at the end of the run)."""


@hookspec
def pax_on_train_end(run: RunInfo, step: int, status: str) -> None:
    """Called when the loop stops; ``status`` is ``completed``, ``interrupted`` or ``failed``."""
