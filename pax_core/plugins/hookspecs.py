"""Every hook a Pax plugin can implement: this module is their reference documentation.

``docs/hooks.md`` is generated from it (``python -m pax_core.plugins.reference``); a test fails
when that page is stale, or when a ``module:attr`` named here does not import.

A plugin is a module, named by an entry point in the ``pax`` group, whose functions are marked
with ``pax_core.hookimpl``::

    # pyproject.toml
    [project.entry-points.pax]
    testplugin = "pax_testplugin.plugin"

    # pax_testplugin/plugin.py
    from pax_core import Component, hookimpl

    PAX_API = ">=1.0,<2"

    @hookimpl
    def pax_register_models():
        return [Component("tiny_lm", "pax_testplugin.models:TinyLm",
                          "one-layer next-token model")]

Keep the plugin module small: ``pax plugins`` and ``pax --help`` import it, so it imports
nothing heavier than ``pax_core``. Factories are ``"module:attribute"`` strings, imported only
when a run uses them. ``PAX_API`` is the range of ``pax_core.API_VERSION`` the plugin was built
for (a PEP 440 specifier); a plugin outside its range is refused and listed as incompatible.

Every hook is called through pluggy, so hook wrappers (``@hookimpl(wrapper=True)``), ``tryfirst``
/ ``trylast`` and pluggy's call monitoring work as pluggy documents; ``PAX_TRACE_PLUGINS=1``
prints every call and its duration. Two families of hooks:

* **Registration** (``pax_register_*``): each returns a list of records. The host calls each
  hook once per plugin, with that plugin's implementation alone (and every wrapper), so every
  record is attributed to the plugin that returned it; none is ``firstresult``. They run on
  every process, once per command. A short name registered by two plugins is an error when used
  (it names both distributions); ``plugin/name`` always works; a plugin's name wins over a
  built-in's.
* **Notifications** (``pax_on_*``): told about a run's life cycle; they return nothing. They run
  on every process of a multi-process run (``run.process_index`` says which; write files from
  process 0 only). Plugins are called one at a time in pluggy's order (the plugin registered
  last first, ``tryfirst``/``trylast`` respected; the built-ins last); one that raises is
  reported as a warning and the others are still called.
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

    Returns ``pax_core.Component`` records. The factory is a Flax ``linen.Module`` class (or a
    function returning one) whose ``__call__(batch: dict[str, Array], train: bool)`` returns a
    ``pax_core.ModelOutput``: the loss to minimise, weighted metrics, and the number of tokens
    the batch held. Optionally it counts its own training FLOPs for MFU:
    ``flops_per_step(batch_spec) -> float`` and a versioned ``flops_formula`` name (see
    ``pax_core.models.output:ModelOutput``). Models and inputs are a catalogue: an experiment
    configures the class itself (``fdl.Config(MyModel, ...)``), and the registered name lists
    it in ``pax plugins``. Register models only (a layer or a backbone is not one): the
    conformance suite checks that each is the model of one of the plugin's experiments, whose
    model it runs.

    Example::

        @hookimpl
        def pax_register_models():
            return [Component("mlp", "pax_core.models.mlp:MlpClassifier", "dense classifier")]
    """


@hookspec
def pax_register_partitioners() -> list[Component]:
    """Register partitioners: strategies that place a run on the device mesh.

    The factory takes no arguments and returns a ``pax_core.Partitioner``. It builds the mesh
    from the experiment's declaration, gives the shardings of the train state and of a batch,
    turns each process's batch into global arrays, and compiles the steps; ``describe`` may
    report facts about the placement (a pipeline's bubble), shown by ``pax plan`` and at the
    start of a run. Chosen by the experiment's ``PARTITIONER`` constant (``--set
    PARTITIONER=name``). Built in: ``data_parallel`` (Pax's pmap path) and ``spmd`` (logical axis
    rules over the declared mesh, ``pax_core.Spmd``, which a plugin may extend); pax-pipeline
    adds ``pipeline``.

    Example::

        @hookimpl
        def pax_register_partitioners():
            return [Component("spmd", "pax_core.parallel.spmd:Spmd", "logical axis rules")]
    """


@hookspec
def pax_register_inputs() -> list[Component]:
    """Register input pipelines.

    The factory is a ``pax_core.Input`` class: an iterator over this process's share of each
    global batch (a dict of numpy arrays) that can save and restore its position. As models,
    inputs are a catalogue: an experiment's ``datasets()`` configures the class itself, and the
    name lists it (the conformance suite checks the class is an ``Input``). Built in:
    ``synthetic``.

    Example::

        @hookimpl
        def pax_register_inputs():
            return [Component("text", "pax_lm.inputs.text:TextInput", "packed text from files")]
    """


@hookspec
def pax_register_checkpointers() -> list[Component]:
    """Register checkpoint back ends.

    The factory is called as ``factory(directory: str, settings: CheckpointSettings)`` and
    returns a ``pax_core.Checkpointer`` (save a step, restore the latest onto given shardings,
    wait, close). A save must never leave a half-written step behind. With
    ``settings.read_only`` (``pax eval``, ``pax export``, ``pax decode``, which may read a job
    while it trains) it only restores and changes nothing in the directory. Chosen by the
    experiment's ``CHECKPOINTER`` constant. Built in: ``orbax``.

    Example::

        @hookimpl
        def pax_register_checkpointers():
            return [Component("orbax", "pax_core.checkpointers.orbax:OrbaxCheckpointer",
                              "async, atomic")]
    """


@hookspec
def pax_register_loggers() -> list[Component]:
    """Register metric sinks.

    The factory is called as ``factory(job_dir: str)`` and returns a ``pax_core.Logger``. The
    loop hands it host-side floats at summary and eval steps, on process 0 only; a logger must
    not block the loop for long. ``finish(status)`` tells it how the training ended
    (``completed``, ``interrupted``, ``failed``), just before ``close``. Chosen by the
    experiment's ``LOGGERS`` constant (``--set "LOGGERS=('console','jsonl')"``, or
    ``pax train --loggers console,jsonl``). Built in: ``console``, ``jsonl``,
    ``tensorboard``.

    Example::

        @hookimpl
        def pax_register_loggers():
            return [Component("jsonl", "pax_core.loggers.jsonl:JsonlLogger", "metrics.jsonl")]
    """


@hookspec
def pax_register_experiments() -> list[ExperimentRef]:
    """Register experiment classes.

    Returns ``pax_core.ExperimentRef`` records: the experiment's name, its class as
    ``"module:Class"``, and ``aliases`` (full dotted names users already know, such as Pax's
    ``tasks.lm.params.lm_cloud.LmCloudSpmd2B``). Look-up accepts the name, ``plugin/name``, any
    unique dotted suffix of the class path or an alias. The class derives from
    ``pax_core.Experiment``.

    Example::

        @hookimpl
        def pax_register_experiments():
            return [ExperimentRef("LmCloudSpmd2B",
                                  "pax_lm.experiments.lm_cloud:LmCloudSpmd2B",
                                  aliases=("tasks.lm.params.lm_cloud.LmCloudSpmd2B",))]
    """


@hookspec
def pax_register_backends() -> list[Component]:
    """Register runtime set-up for a platform, named as JAX names it (``cpu``, ``gpu``, ``tpu``;
    ``cuda`` and ``rocm`` count as ``gpu``).

    The factory takes no arguments and returns a ``pax_core.Backend``. Before JAX starts its
    runtime, ``presets()`` (named groups of environment variables and XLA or libtpu flags,
    ``pax_core.Preset``) are applied, keeping every value the user set themselves and skipping
    those ``PAX_NO_PRESETS`` names (``gpu.nccl``, ``gpu``, ``all``); what is in force is
    printed at the start and written in the start record. Then ``prepare()`` runs (what a
    preset cannot say, a ``jax.config`` switch); both touch only the backend's own platform.
    ``check(devices)`` runs after, on the platform JAX picked (refuse unusable devices with a
    ``UsageError``), ``check_program(devices, program)`` sees the run's traced initialisation
    before anything compiles (refuse what the devices cannot run: the gpu backend refuses FP8
    before Ada/Hopper), and ``attention(...)`` serves ``pax_core.dot_product_attention`` on that
    platform (a fused kernel where the platform has one: Splash on TPUs, cuDNN's with
    pax-gpu). With ``--platform`` or ``JAX_PLATFORMS`` only that platform's backend prepares;
    otherwise every installed one does, since the platform is known only once JAX has
    started. A platform without a backend runs with JAX's defaults; a plugin's backend
    replaces the built-in one of its platform.
    Built in: ``cpu``, ``tpu``.

    Example::

        @hookimpl
        def pax_register_backends():
            return [Component("cpu", "pax_core.backends.cpu:CpuBackend", "host CPU")]
    """


@hookspec
def pax_register_mesh_layouts() -> list[Component]:
    """Register how devices are placed in an ICI x DCN mesh, and what slices need set up.

    The factory takes no arguments and returns a ``pax_core.MeshLayout``:
    ``presets(dcn, processes)`` names environment variables and flags for a mesh of ``dcn``
    slices (applied before JAX starts, as a backend's are), and
    ``device_grid(devices, ici, dcn)`` arranges the devices, each mesh axis being (DCN part) x
    (ICI part) with one slice's devices filling the ICI part. An experiment's ``MESH_LAYOUT``
    names one; when it names none, a mesh with DCN axes uses the layout a plugin registers
    (pax-multislice's), else the built-in ``contiguous`` one.

    Example::

        @hookimpl
        def pax_register_mesh_layouts():
            return [Component("multislice", "pax_multislice.layouts:MultisliceLayout",
                              "TPU slices by slice_index, processes as slices elsewhere")]
    """


@hookspec
def pax_register_commands() -> list[Component]:
    """Register extra ``pax`` subcommands.

    The factory is a ``typer.Typer`` app (or a plain function, wrapped into one); it is imported
    only when the subcommand runs, so ``help`` is what ``pax --help`` shows. The plugin host is
    ``ctx.obj``; ``pax_core.restore_latest`` gives a command the latest state of a job, and the
    option types (``pax_core.JobDirOpt``, ``pax_core.SetOpt``, ...) spell options as ``pax
    train`` does.

    Example::

        @hookimpl
        def pax_register_commands():
            return [Component("decode", "pax_lm.commands.decode:decode", "sample from an LM job")]
    """


@hookspec
def pax_register_trial_runners() -> list[Component]:
    """Register where ``pax sweep`` (the pax-sweep plugin) trains its trials (``--runner
    NAME``).

    The factory is called as ``factory(host, parallel=K, platform=P)`` and returns a
    ``pax_sweep.TrialRunner``: up to ``slots`` trials at once, each a ``pax train`` argument
    list with its own job directory (which the runner's machines must reach) and a log file;
    ``wait`` reports each trial's exit status, ``stop`` stops them as Ctrl-C stops ``pax
    train`` (each saves its checkpoint). pax-sweep registers ``local`` (processes of this
    machine, each with its share of the devices, ``Backend.share``); pax-ray, ``ray``.

    Example::

        @hookimpl
        def pax_register_trial_runners():
            return [Component("local", "pax_sweep.runners:LocalRunner",
                              "trials as processes of this machine")]
    """


@hookspec
def pax_register_weight_formats() -> list[Component]:
    """Register the formats of model weights outside Pax that ``pax import FORMAT SOURCE`` reads
    into a new job and ``pax export --format FORMAT`` writes a job's weights in.

    The factory is called with no arguments and returns a ``pax_core.WeightFormat``: it reads
    a source's configuration into the experiment and overrides that rebuild its model
    (``inspect``), yields its weights one tensor at a time by their paths in the model's
    parameters (``read``), and writes a job's parameters, fetched one at a time, in its layout
    (``write``). The core does the rest: checks every tensor against the model, places each
    on the devices as it is read, saves step 0 as a weights-only checkpoint (``Weights``, from
    which ``pax train`` starts a fresh optimizer state) and records the job. pax-lm registers
    ``hf`` (Hugging Face folders of decoder-only LMs).

    Example::

        @hookimpl
        def pax_register_weight_formats():
            return [Component("hf", "pax_lm.hf.format:HfFormat",
                              "Hugging Face folders: config.json, safetensors, tokenizer")]
    """


@hookspec
def pax_register_harnesses() -> list[Component]:
    """Register an outside evaluation harness that ``pax eval --harness TASKS`` evaluates the
    plugin's jobs with, on the harness's own named tasks.

    The factory is a function called as ``factory(job, tasks, limit=N, num_fewshot=K)``:
    ``job`` is a ``pax_core.JobRequest``, ``tasks`` the task names the user gave, ``limit``
    (documents per task) and ``num_fewshot`` None unless given. It checks what it can before
    it restores the job (the harness installed, every task known: a ``UsageError`` saying
    what to do), so that a mistake costs no restore; then it restores the job
    (``job.restore``), evaluates, and returns a JSON-ready dict holding ``step`` (the restored
    checkpoint's), ``results`` (task -> metric name -> number) and whatever else the harness
    reports; ``--output`` writes it whole. A job is evaluated by the harness of the plugin
    whose package defines its experiment's class, or else the nearest base class whose plugin
    has one (an experiment of the user's derived from pax-lm's gets pax-lm's); a plugin
    registers at most one. pax-lm registers ``lm-eval`` (EleutherAI's lm-evaluation-harness,
    the ``pax-lm[harness]`` extra).

    Example::

        @hookimpl
        def pax_register_harnesses():
            return [Component("lm-eval", "pax_lm.harness:evaluate",
                              "EleutherAI's lm-evaluation-harness tasks")]
    """


@hookspec
def pax_on_train_start(run: RunInfo) -> None:
    """Called once the train state is ready, before the first step of this invocation.

    ``run`` is a ``pax_core.RunInfo``; ``run.start_step`` is the restored step (0 for a fresh
    run). Runs on every process.
    """


@hookspec
def pax_on_metrics(run: RunInfo, step: int, kind: str, metrics: dict[str, Any]) -> None:
    """Called with host-side metric values at summary steps (``kind="train"``) and after each
    eval (``kind="eval/<dataset>"``). Values are Python floats, the same on every process; runs
    on every process."""


@hookspec
def pax_on_checkpoint_saved(run: RunInfo, step: int, directory: str) -> None:
    """Called once the checkpoint of ``step`` is committed under ``directory`` (saves are
    asynchronous: this comes when the next save starts, or at the end of the run). Runs on every
    process, each once its own part is written."""


@hookspec
def pax_on_train_end(run: RunInfo, step: int, status: str) -> None:
    """Called when the loop stops; ``status`` is ``completed``, ``interrupted`` or ``failed``.
    Runs on every process, also after a failure."""
