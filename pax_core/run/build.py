"""Putting a run together: mesh, inputs, model, components and a train state.

``pax train`` and ``pax eval`` share this; the loop itself is in ``pax_core.run.loop``. Everything a
user can get wrong is checked in ``build_run``, before anything is written.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
from typing import Any

import flax.linen as nn
import jax
import jax.extend
import numpy as np

from pax_core.checkpointers.base import (
    Checkpointer,
    CheckpointSettings,
    StepRemoved,
    Weights,
    params_mismatch,
)
from pax_core.checkpointers.integrity import DamagedCheckpoint, UnverifiedCheckpoint
from pax_core.config.resolve import ResolvedExperiment
from pax_core.config.task import Job, Task, trained_mask
from pax_core.errors import PaxError, RunError, UsageError, first_line, warn
from pax_core.inputs.base import Input
from pax_core.models.weight_format import WeightFormat, key_paths
from pax_core.parallel.layouts import mesh_layout
from pax_core.parallel.partitioner import Partitioner
from pax_core.plugins.host import PluginHost
from pax_core.plugins.records import Registered
from pax_core.run.runtime import check_program, donates_train_state
from pax_core.run.state import (
    TrainState,
    ema_params,
    logical_axes,
    make_init_fn,
    state_from_weights,
)
from pax_core.run.steps import make_train_step


def weight_format(host: PluginHost, name: str) -> WeightFormat:
    """The registered weight format ``name`` (``pax import``, ``pax export --format``,
    ``init_from``), built."""
    formats = host.components("weight_formats")
    if not len(formats):
        raise UsageError(f"no weight format is installed, so none reads or writes {name!r}: "
                         f"pip install pax-lm for hf (Hugging Face folders)")
    try:
        found = formats.get(name)
    except UsageError as e:
        raise UsageError(f"{e}; the weight formats installed: {', '.join(formats.names())}"
                         ) from None
    return found.build()


def partitioner_name(experiment: Any) -> str:
    """The experiment's partitioner: its own choice, else Pax's (SPMD for a declared mesh)."""
    if experiment.PARTITIONER:
        return experiment.PARTITIONER
    return "spmd" if experiment.ICI_MESH_SHAPE is not None else "data_parallel"


def component(host: PluginHost, kind: str, name: str, constant: str) -> Registered:
    """The registered component an experiment constant names."""
    try:
        return host.components(kind).get(name)
    except UsageError as e:
        raise UsageError(f"{e} (set by the experiment's {constant})") from None


@dataclasses.dataclass
class Run:
    """Everything a loop needs, built from a resolved experiment; nothing allocated yet."""

    resolved: ResolvedExperiment
    job: Job
    partitioner: Partitioner
    train_input: Input
    eval_inputs: list[Input]
    tx: Any
    state_shardings: Any
    abstract_state: Any
    # The state's initialisation as traced once for ``abstract_state``; ``init_state`` runs it.
    traced_init: jax.extend.core.ClosedJaxpr
    batch_spec: dict[str, jax.ShapeDtypeStruct]
    checkpointer: Registered
    loggers: list[Registered]
    donates_train_state: bool
    # The mesh layout that placed the devices (MESH_LAYOUT), and the presets in force
    # (``pax_core.Preset``), as the start record and the console show them.
    mesh_layout: str = "contiguous"
    presets: list[str] = dataclasses.field(default_factory=list)
    # Where compiled programs are cached (``pax_core.run.compilation_cache``), or "off".
    compilation_cache: str = "off"
    # The train step for ``batch_spec``, where it was compiled while the run was built (to
    # fit an ``auto`` constant to the devices: ``pax_core.run.fitting``), and what that chose.
    first_step: Any = None
    fitted: list[str] = dataclasses.field(default_factory=list)

    @property
    def task(self) -> Task:
        return self.job.task

    def batch_shardings(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Shardings for a batch of arrays or ``ShapeDtypeStruct``s."""
        return {k: self.partitioner.batch_sharding(len(v.shape)) for k, v in batch.items()}

    def eval_params(self, state: TrainState) -> Any:
        """The parameters the job evaluates, decodes and exports: the optimizer's moving
        average with ``task.train.eval_use_ema_states``, else the trained ones."""
        return ema_params(state) if self.task.train.eval_use_ema_states else state.params

    def eval_variables(self, state: TrainState) -> dict[str, Any]:
        """The model's variables as the job evaluates, predicts and exports them: the
        ``eval_params`` beside the model state (batch norm's moving statistics)."""
        return state.variables(self.eval_params(state))

    @property
    def eval_variables_shardings(self) -> dict[str, Any]:
        """Where ``eval_variables`` live: with the parameters and the model state."""
        return {"params": self.state_shardings.params, **self.state_shardings.model_state}

    def make_checkpointer(self, directory: str, read_only: bool = False) -> Checkpointer:
        """The run's checkpointer over ``directory``; ``read_only`` for a command that reads a
        job, which may still be training (``CheckpointSettings.read_only``)."""
        train = self.task.train
        settings = CheckpointSettings(train.save_interval_steps, train.save_max_to_keep,
                                      keep_interval_steps=train.save_keep_interval_steps,
                                      keep_interval_seconds=train.keep_interval_seconds(),
                                      read_only=read_only)
        return self.checkpointer.build(directory, settings)

    def compile_train_step(self, donate_state: bool | None = None,
                           batch_spec: dict[str, jax.ShapeDtypeStruct] | None = None,
                           compiler_options: dict[str, Any] | None = None,
                           ) -> jax.stages.Compiled:
        """``(state, batch) -> (state, metrics)``, compiled ahead of time by the partitioner for
        this run's shardings and the shapes of ``batch_spec`` (global; default: the training
        input's first batch). The old state is donated where the devices' backend says so,
        unless ``donate_state`` decides. ``compiler_options`` are XLA's debug options for this
        compilation alone (``pax plan`` skips machine-code optimisation: it never runs the
        program)."""
        learner, partitioner = self.task.train.learner, self.partitioner
        step = make_train_step(self.task.model, self.tx, learner.optimizer.learning_rate_at,
                               learner.num_microbatches, partitioner.reduction,
                               skip_anomalies=learner.on_anomaly == "skip",
                               trained=functools.partial(trained_mask, learner)
                               if learner.freezes else None)
        donate = self.donates_train_state if donate_state is None else donate_state
        spec = self.batch_spec if batch_spec is None else batch_spec
        batch_shardings = self.batch_shardings(spec)
        jitted = partitioner.compile_step(step, self.state_shardings, batch_shardings,
                                          (self.state_shardings, partitioner.replicated),
                                          donate_state=donate)
        batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_shardings[k])
                 for k, v in spec.items()}
        return jitted.lower(self.abstract_state, batch).compile(compiler_options)

    def init_state(self) -> TrainState:
        """A fresh state, created directly with its output shardings. It replays the
        initialisation ``build_run`` traced rather than tracing the model again, which would
        cost as long as tracing its train step (a third of a second for a 25M LM)."""
        replay = jax.extend.core.jaxpr_as_fun(self.traced_init)
        structure = jax.tree.structure(self.abstract_state)

        def init(seed: jax.Array) -> TrainState:
            return jax.tree.unflatten(structure, replay(seed))

        seed = np.uint32(self.task.train.random_seed)
        return self.partitioner.compile_init(init, self.state_shardings)(seed)


    def state_from_weights(self, weights: Weights, step: int = 0) -> TrainState:
        """A fresh state around restored weights (a weights-only step: an imported model),
        on the run's shardings: the optimizer state as it starts on these parameters. A
        parameter the step lacks starts as a fresh run's when ``task.train.init_from_ignore``
        or ``init_from_optional`` matches it (adapters added to an imported model), takes the
        value of the held parameter an ``init_from_rules`` rule maps it to (a frozen copy of
        the imported weights), and is refused otherwise."""
        restored, params = weights.params, weights.params
        held = key_paths(restored)
        absent = [p for p in key_paths(self.abstract_state.params) if p not in held]
        if absent:
            train, by_name = self.task.train, {"/".join(p): p for p in held}
            filled = {}
            for path in absent:
                name, want = "/".join(path), _at(self.abstract_state.params, path).shape
                source = train.init_from_source(name)
                if train.init_from_ignores(name):
                    continue
                if source in by_name:
                    value = _at(restored, by_name[source])
                    if tuple(value.shape) != tuple(want):
                        raise params_mismatch(step, _keystr(by_name[source]),
                                              tuple(value.shape), tuple(want))
                    filled[path] = value
                elif not train.init_from_may_lack(name):
                    raise params_mismatch(step, _keystr(path), None, tuple(want))
            params = jax.tree_util.tree_map_with_path(
                lambda path, leaf: (_at(restored, _key(path)) if _key(path) in held
                                    else filled.get(_key(path), leaf)),
                self.init_state().params)
        seed = np.uint32(self.task.train.random_seed)
        make = self.partitioner.compile_init(
            lambda p, m, s: state_from_weights(self.tx, p, m, s), self.state_shardings)
        return make(params, weights.model_state, seed)


def _keystr(path: tuple[str, ...]) -> str:
    """``path`` as the checkpoint's messages name it: ``['decoder']['stack']...``."""
    return "".join(f"['{k}']" for k in path)


def _key(path: Any) -> tuple[str, ...]:
    """A JAX key path as the strings ``key_paths`` names it by."""
    return tuple(str(getattr(k, "key", k)) for k in path)


def _at(tree: Any, keys: tuple[str, ...]) -> Any:
    for key in keys:
        tree = tree[key]
    return tree


# How long a reader goes on listing and reading the newest step while its job, training, drops
# each step it tries (a job saving every step, its steps kept less time than a read takes).
READ_PATIENCE = 60.0


def restore_or_init(host: PluginHost, run: Run, checkpointer: Checkpointer,
                    chosen: int | None = None) -> tuple[TrainState, int]:
    """The newest checkpoint that restores (or the ``chosen`` step), onto the run's shardings
    (and the input's position), or a fresh state at step 0 when there is none.

    Damaged newer steps are set aside (``JOB_DIR/damaged_checkpoints``) once an older one has
    restored, with a warning naming each; a read-only checkpointer leaves them in place. With
    ``on_damaged_checkpoint='stop'``, or when a step was ``chosen``, the run stops at a damaged
    step instead. When every step is damaged nothing is moved and the run stops, so that the
    same command never starts over from step 0 silently. A step that disappears while a
    reader restores it (its job is training, and dropped it) sends the reader to the newest
    steps again.
    """
    deadline, tries = time.monotonic() + READ_PATIENCE, 0
    while time.monotonic() < deadline or not tries:
        tries += 1
        try:
            return _restore_newest(host, run, checkpointer, chosen)
        except StepRemoved:  # a reader's job saved and dropped steps meanwhile: list again
            continue
    raise RunError(f"the steps of {checkpointer.directory} kept being removed while they were "
                   f"read ({tries} tries); try again, or once the job has stopped training")


def _restore_newest(host: PluginHost, run: Run, checkpointer: Checkpointer,
                    chosen: int | None) -> tuple[TrainState, int]:
    stop = chosen is not None or run.task.train.on_damaged_checkpoint == "stop"
    damaged: list[tuple[int, DamagedCheckpoint]] = []
    try:
        steps = checkpointer.all_steps()
        if chosen is not None and chosen not in steps:
            listed = ", ".join(map(str, steps)) or "none"
            raise UsageError(f"no checkpoint at step {chosen} in {checkpointer.directory} (its "
                             f"steps: {listed}); pick one of them for --restore-checkpoint-step")
        for step in reversed(steps if chosen is None else [chosen]):
            try:
                state, input_state = checkpointer.restore(step, run.abstract_state)
                if isinstance(state, Weights):
                    state = run.state_from_weights(state, step)
                if input_state:
                    _set_input_position(run.train_input, input_state)
            except DamagedCheckpoint as e:
                if stop:
                    remedy = ("choose another --restore-checkpoint-step" if chosen is not None
                              else "move it away to resume from the one before, or set "
                                   "task.train.on_damaged_checkpoint='fallback'")
                    raise UsageError(f"checkpoint step {step} in {checkpointer.directory} is "
                                     f"damaged: {e}; {remedy}") from None
                damaged.append((step, e))
                continue
            _set_aside_damaged(checkpointer, damaged, step)
            return state, step
    except (PaxError, StepRemoved):
        raise
    except Exception as e:
        raise host.provider_error("checkpointer", checkpointer, e) from e
    if damaged:
        listed = "; ".join(f"step {s}: {why}" for s, why in damaged)
        raise RunError(f"every checkpoint in {checkpointer.directory} is damaged ({listed}); "
                       f"nothing was moved: repair them, or move {checkpointer.directory} away "
                       f"(or use another --job-dir) to train again from step 0")
    return run.init_state(), 0


def _set_aside_damaged(checkpointer: Checkpointer, damaged: list[tuple[int, DamagedCheckpoint]],
                       restored: int) -> None:
    """Move the damaged (or unverifiable) steps newer than the ``restored`` one out of the way
    of the run's later saves, one warning each; a reader (read-only) only says which it passed
    over."""
    for step, why in damaged:
        state = "cannot be verified" if isinstance(why, UnverifiedCheckpoint) else "is damaged"
        if checkpointer.settings.read_only:
            warn(f"passing over checkpoint step {step} ({why}); using step {restored} (left "
                 f"in place: pax train sets a damaged step aside when it resumes)")
            continue
        where = checkpointer.set_aside(step)
        if where is None:
            raise UsageError(f"checkpoint step {step} in {checkpointer.directory} {state}: "
                             f"{why}; this checkpointer cannot set it aside: move it away to "
                             f"resume from step {restored}")
        warn(f"checkpoint step {step} {state} ({why}); moved to {where}, resuming from "
             f"step {restored}")


def _set_input_position(data: Input, position: dict[str, Any]) -> None:
    """Continue ``data`` from a checkpoint's saved position; one it cannot take makes the
    checkpoint damaged (it cannot resume where it stopped), unless the input says why with a
    ``PaxError`` (a usage error stops the run, the checkpoints untouched)."""
    try:
        data.set_state(position)
    except PaxError:  # the input's own verdict (another process count, say): the user's to act on
        raise
    except Exception as e:
        what = first_line(e)
        raise DamagedCheckpoint(f"its saved input position does not fit input '{data.name}' "
                                f"({what})") from e


def _check_early_stopping(run_name: str, early: Any, eval_inputs: list[Input]) -> None:
    """The dataset early stopping watches must be one the run evaluates (the first, when the
    setting names none)."""
    if early is None:
        return
    names = [d.name for d in eval_inputs]
    if not names:
        raise UsageError(f"{run_name}: task.train.early_stopping watches an eval metric, but the "
                         f"experiment declares no eval datasets")
    if not early.dataset:
        early.dataset = names[0]
    elif early.dataset not in names:
        raise UsageError(f"{run_name}: task.train.early_stopping.dataset is "
                         f"{early.dataset!r}, not one of the eval datasets ({', '.join(names)})")


def _check_ema(run_name: str, train: Any) -> None:
    if train.eval_use_ema_states and not train.learner.optimizer.ema_decay:
        raise UsageError(f"{run_name}: task.train.eval_use_ema_states evaluates the moving "
                         f"average of the parameters, but the optimizer keeps none; set "
                         f"task.train.learner.optimizer.ema_decay (e.g. 0.9999)")
    if train.eval_use_ema_states and train.learner.freezes:
        raise UsageError(f"{run_name}: task.train.eval_use_ema_states averages every "
                         f"parameter, but the learner freezes some (bprop_variable_inclusion/"
                         f"exclusion); evaluate the trained parameters, or train them all")


def _check_trained(run_name: str, learner: Any, params: Any) -> None:
    """Refuse freezing patterns that leave nothing trained, or that match no parameter."""
    if not learner.freezes:
        return
    paths = ["/".join(p) for p in key_paths(params)]
    for field in ("bprop_variable_inclusion", "bprop_variable_exclusion"):
        for pattern in getattr(learner, field):
            if not any(re.fullmatch(pattern, path) for path in paths):
                raise UsageError(f"{run_name}: task.train.learner.{field} {pattern!r} matches "
                                 f"no parameter (they are named like {paths[0]}); correct it")
    if not any(learner.trained(path) for path in paths):
        raise UsageError(f"{run_name}: task.train.learner's bprop_variable_inclusion/exclusion "
                         f"freeze every parameter; leave some to train")


def _check_microbatches(run_name: str, train_input: Input, num_microbatches: int,
                        num_shards: int) -> None:
    per_shard = train_input.batch_size // num_shards
    if per_shard % num_microbatches:
        raise UsageError(
            f"{run_name}: num_microbatches {num_microbatches} must divide the per-device batch "
            f"({per_shard}); change task.train.learner.num_microbatches or the batch_size"
        )


def build_run(host: PluginHost, resolved: ResolvedExperiment, devices: list[jax.Device], *,
              read_data: bool = True) -> Run:
    """Build the job's objects, the mesh and the shardings; allocate nothing on devices yet.

    With ``read_data`` every input checks its data (``Input.check``) and the training input
    reads its first batch now, so that missing or bad data is reported before anything is
    written; planning a run skips both.
    """
    job = resolved.build()
    exp = resolved.experiment
    partitioner = component(host, "partitioners", partitioner_name(exp), "PARTITIONER").build()
    checkpointer = component(host, "checkpointers", exp.CHECKPOINTER, "CHECKPOINTER")
    loggers = [component(host, "loggers", name, "LOGGERS") for name in exp.LOGGERS]
    layout, partitioner.layout = mesh_layout(host, exp)
    partitioner.setup(exp, devices)
    for data in job.datasets:
        partitioner.check_batch_size(data.name, data.batch_size)
        data.shard(jax.process_index(), jax.process_count())
        if read_data:
            _ask(host, data, data.check)
    train_input = next(d for d in job.datasets if d.is_training)
    eval_inputs = [d for d in job.datasets if not d.is_training]
    _check_early_stopping(resolved.name, job.task.train.early_stopping, eval_inputs)
    _check_ema(resolved.name, job.task.train)
    learner = job.task.train.learner
    _check_microbatches(resolved.name, train_input, learner.num_microbatches,
                        partitioner.num_batch_shards)
    tx = learner.transformation()
    local = _ask(host, train_input, train_input.peek if read_data
                 else train_input.abstract_batch)
    batch_spec = {
        k: jax.ShapeDtypeStruct((train_input.batch_size, *v.shape[1:]), v.dtype)
        for k, v in local.items()
    }
    init = make_init_fn(job.task.model, tx, batch_spec)
    try:
        with partitioner.context():
            traced, boxed = jax.make_jaxpr(init, return_shape=True)(np.uint32(0))
    except PaxError:
        raise  # the model refused the batch (images of another size): the user's to fix
    except Exception as e:
        raise host.provider_error("model", job.task.model, e) from e
    check_program(host, devices, traced)
    abstract = nn.meta.unbox(boxed)
    _check_trained(resolved.name, learner, abstract.params)
    shardings = partitioner.state_shardings(abstract, logical_axes(boxed))
    abstract = jax.tree.map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
    )
    return Run(resolved, job, partitioner, train_input, eval_inputs, tx, shardings, abstract,
               traced, batch_spec, checkpointer, loggers, donates_train_state(host, devices),
               layout)


def _ask(host: PluginHost, data: Input, question: Any) -> dict[str, Any]:
    """A local batch (or its shapes, or a check) from ``data``; its failures are reported
    against it."""
    try:
        return question()
    except StopIteration:
        raise RunError(f"input '{data.name}' is empty") from None
    except PaxError:
        raise
    except Exception as e:
        raise host.provider_error("input", data, e) from e
