"""What ``pax train`` and ``pax eval`` do, apart from parsing the command line (``pax eval
--harness`` finds here which plugin's harness evaluates a job). ``run_training`` returns how a
training ended, for ``pax_core.train`` (``pax_core.api``); ``pax train`` keeps its status.

Order matters: everything a user can get wrong (experiment name, overrides, component names,
mesh and batch sizes, a checkpoint that does not fit the config) is checked before the job
directory's record is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Iterator, Mapping
from typing import Any

import jax

from pax_core.checkpointers.base import Checkpointer
from pax_core.config import trust
from pax_core.config.lookup import find_experiment
from pax_core.config.resolve import ResolvedExperiment, choose_experiment, configure
from pax_core.errors import PaxError, RunError, Stopped, UsageError, warn
from pax_core.files import job_path, storage_failure
from pax_core.loggers import LoggerGroup
from pax_core.loggers.base import Logger
from pax_core.loggers.console import run_summary
from pax_core.parallel.processes import DistributedOptions, check_same_software, from_primary
from pax_core.plugins.host import PluginHost
from pax_core.plugins.notify import RunInfo, notify
from pax_core.plugins.records import Registered
from pax_core.plugins.versions import library_versions
from pax_core.run.build import Run, build_run, restore_or_init
from pax_core.run.evaluation import Evaluator
from pax_core.run.fitting import build_fitted_run
from pax_core.run.jobdir import JobDir
from pax_core.run.logfile import library_logs
from pax_core.run.loop import TrainLoop, TrainLoopOptions
from pax_core.run.runtime import start_runtime
from pax_core.run.state import TrainState
from pax_core.run.warm_start import warm_start


def config_text(resolved: ResolvedExperiment, host: PluginHost) -> str:
    """The config as the job records it (``config.txt``): a header naming the experiment, its
    overrides and the software, then the config tree."""
    header = [f"# experiment: {resolved.name}"]
    header += [f"# override: {o}" for o in resolved.overrides]
    header += [f"# plugin {n}: {v}" for n, v in host.active_versions().items()]
    header += [f"# {n}: {v}" for n, v in library_versions().items()]
    return "\n".join(header) + "\n" + resolved.to_text()


def prepare_run(host: PluginHost, exp: str, plugin: str | None, set_items: list[str],
                job_dir: JobDir, platform: str | None, distributed: DistributedOptions | None,
                config_file: str | None = None, read_data: bool = True,
                trains: bool = False) -> Run:
    """The run of ``exp`` for ``job_dir``, with JAX started as the experiment wants it
    (``read_data``: see ``build_run``); a run that ``trains`` fits the experiment's ``auto``
    constants to the devices' memory (``pax_core.run.fitting``), others take its defaults."""
    chosen = choose_experiment(host, exp, plugin, set_items)
    job_dir.check_same_experiment(chosen.name)
    # The config is made once JAX has started as the presets and processes want it, since an
    # experiment may ask JAX for its devices while it makes its config.
    runtime = start_runtime(host, platform, chosen.experiment, distributed)
    check_same_software(host)
    if trains:
        run = build_fitted_run(host, chosen, config_file, runtime.devices, read_data)
    else:
        run = build_run(host, configure(chosen, config_file), runtime.devices,
                        read_data=read_data)
    run.presets = [s.as_text() for s in runtime.settings]
    run.compilation_cache = runtime.compilation_cache
    return run


@contextlib.contextmanager
def _locked(job_dir: JobDir, primary: bool) -> Iterator[None]:
    """Hold the job directory for this run; process 0 takes the lock, and when it cannot,
    every process stops with its message."""
    with contextlib.ExitStack() as stack:
        error = None
        if primary:
            try:
                stack.enter_context(job_dir.lock())
            except UsageError as e:
                error = str(e)
        error = from_primary(error)
        if error:
            raise UsageError(error)
        yield


@dataclasses.dataclass(frozen=True)
class Trained:
    """How a training ended: its ``status`` (``completed``), the ``step`` it reached, and the
    last train summary and eval results it logged (empty where it logged none: a job trained
    to its end in an earlier run, a process other than 0)."""

    status: str
    step: int
    train_metrics: dict[str, float]
    eval_metrics: dict[str, dict[str, float]]


class _Latest(Logger):
    """Keeps the last train summary and each eval dataset's last results in memory, for the
    caller of ``run_training``."""

    def __init__(self) -> None:
        super().__init__("")
        self.train: dict[str, float] = {}
        self.evals: dict[str, dict[str, float]] = {}
        self.trained = False  # whether this invocation trained (a run started)

    def start(self, **kwargs: Any) -> None:
        self.trained = True

    def write(self, step: int, kind: str, metrics: Mapping[str, float]) -> None:
        if kind == "train":
            self.train = dict(metrics)
        elif kind.startswith("eval/"):
            self.evals[kind.removeprefix("eval/")] = dict(metrics)


def train(host: PluginHost, *, exp: str | None, plugin: str | None, set_items: list[str],
          job_dir: str, **options: Any) -> str:
    """``pax train``: ``run_training``'s final status."""
    return run_training(host, exp=exp, plugin=plugin, set_items=set_items, job_dir=job_dir,
                        **options).status


def run_training(host: PluginHost, *, exp: str | None, plugin: str | None,
                 set_items: list[str], job_dir: str,
                 platform: str | None = None, distributed: DistributedOptions | None = None,
                 peak_tflops: float | None = None,
                 profile_steps: tuple[int, int] | None = None,
                 restore_step: int | None = None, evaluate: bool = True,
                 config_file: str | None = None, verbose: bool = False) -> Trained:
    """Train (or resume) ``exp`` in ``job_dir``; returns how it ended. Without ``exp``
    the job's recorded experiment, overrides (before ``set_items``) and config file are used,
    as readers of a job do: a job ``pax import`` made trains as it is.

    Every process of a multi-process run calls this; only process 0 writes the record and logs.
    ``peak_tflops`` replaces the device's peak in MFU; ``profile_steps`` is a window of steps
    to trace (``pax_core.speed.profiling``). ``restore_step`` restarts from that checkpoint,
    setting the later ones aside (``JOB_DIR/rolled_back_checkpoints``); without ``evaluate``
    the eval datasets are not evaluated during training; ``config_file`` is a Fiddle JSON
    config (a job's ``config.json``) trained in place of the experiment's; ``verbose`` puts
    every metric on the console's step lines.
    """
    started = time.monotonic()
    jd = JobDir(job_dir)
    if exp is None:
        if not jd.path.exists():
            raise UsageError(f"--job-dir {jd.path} does not exist; pass --exp to start a job "
                             f"there")
        exp, set_items, recorded_file = _recorded(host, jd, set_items)
        config_file = config_file or recorded_file
    if jd.remote:  # it makes nothing there (one object written and removed): it can go first
        jd.create()
    run = prepare_run(host, exp, plugin, set_items, jd, platform, distributed, config_file,
                      trains=True)
    if not jd.remote:  # a local one is made only once everything else is checked
        jd.create()
    primary = jax.process_index() == 0
    latest = _Latest()
    try:
        with _locked(jd, primary), library_logs(jd.path, jax.process_index()):
            status, step, signum = _train_locked(
                host, run, jd, primary,
                TrainLoopOptions(peak_tflops, profile_steps, evaluate, verbose),
                restore_step, config_file, latest)
    except PaxError:
        raise
    except Exception as e:
        found = storage_failure(e)
        if found is None:
            raise
        raise RunError(f"cannot write to --job-dir {jd.path} ({found[0]}): {found[1]}, then "
                       f"run the same command (its checkpoints are as they were)") from e
    if status == "interrupted":
        raise Stopped(f"stopped on request ({signal.Signals(signum).name}) at step {step}; the "
                      f"checkpoint is saved: run the same command to resume", signum)
    if primary and latest.trained:
        shown = "tensorboard" in run.resolved.experiment.LOGGERS
        print("\n".join(run_summary(
            run.resolved.name, step, run.task.train.num_train_steps,
            time.monotonic() - started, latest.train, latest.evals,
            str(jd.checkpoints / str(step)), str(jd.path), tensorboard=shown)), flush=True)
    return Trained(status, step, latest.train, latest.evals)


def _train_locked(host: PluginHost, run: Run, jd: JobDir, primary: bool,
                  options: TrainLoopOptions, restore_step: int | None, config_file: str | None,
                  latest: Logger) -> tuple[str, int, int]:
    """Restore or start, record the invocation, train (``latest`` beside the run's loggers on
    process 0); returns (status, step, stop signal)."""
    checkpointer = run.make_checkpointer(str(jd.checkpoints))
    status, step = "failed", 0
    try:
        if primary:  # the first step's program: seconds to minutes of silence otherwise
            print(f"{run.resolved.name}: compiling the train step", flush=True)
        loop = TrainLoop(run, checkpointer, host, options)
        state, step = restore_or_init(host, run, checkpointer, restore_step)
        if run.task.train.init_from and not checkpointer.all_steps():
            state = warm_start(host, run, state)  # a new job only: a resumed one has its own
        total = run.task.train.num_train_steps
        if step > total:
            raise UsageError(f"the checkpoint in {jd.checkpoints} is at step {step}, past "
                             f"num_train_steps {total}; raise NUM_TRAIN_STEPS (or "
                             f"task.train.num_train_steps) or use another --job-dir "
                             f"(nothing was changed)")
        if restore_step is not None:
            _roll_back(checkpointer, restore_step)
        done = _done_before(run, jd, step, restored_to=restore_step)
        if done:  # nothing recorded, nothing trained
            if primary:
                print(f"{run.resolved.name}: {done}")
            checkpointer.close()
            return "completed", step, 0
        recorded_text = config_text(run.resolved, host)
        if primary:
            changed = jd.changed_settings(recorded_text) if step else []
            if changed:
                warn(f"resuming from step {step} with settings changed since the last run: "
                     f"{'; '.join(changed)}")
            jd.record(experiment=run.resolved.name, overrides=run.resolved.overrides,
                      config_json=run.resolved.to_json(), config_text=recorded_text,
                      plugins=host.active_versions(),
                      extra={"config_file": config_file} if config_file else None)
        info = RunInfo(run.resolved.name, str(jd.path), total, step, jax.process_index(),
                       jax.process_count())
        loggers = LoggerGroup([*(e.build(str(jd.path)) for e in run.loggers), latest]
                              if primary else [])
        # The loop takes the state out of ``start``: a name here would keep the first state
        # alive beside every later one, a whole model and optimizer state more in memory.
        start = [state]
        del state
        try:
            _, step, status = loop.run_loop(start, info, loggers, recorded_text)
            if loop.target_reached is not None and primary:
                jd.record_target(run.task.train.early_stopping, *loop.target_reached)
                print(f"{run.resolved.name}: reached its target at step {step} "
                      f"({loop.target_reached[1]}); training stopped early")
        finally:
            loggers.finish(status)
            loggers.close()
            notify(host.pm, "pax_on_train_end", run=info, step=step, status=status)
    except BaseException:
        with contextlib.suppress(Exception):  # the failure is reported, not a second one
            checkpointer.close()
        raise
    checkpointer.close()
    return status, step, loop.stop_signal


def _done_before(run: Run, jd: JobDir, step: int, restored_to: int | None) -> str | None:
    """Why an earlier run left nothing to train (it trained to the last step, or reached its
    early-stopping target), or None."""
    total = run.task.train.num_train_steps
    if step and step == total and restored_to is None:
        return (f"trained to step {total} in an earlier run; nothing to train (raise "
                f"NUM_TRAIN_STEPS to train on; pax eval evaluates it)")
    reached = jd.target_reached(run.task.train.early_stopping, step)
    if reached:
        return (f"reached its target at step {step} ({reached}) in an earlier run; nothing to "
                f"train (change task.train.early_stopping, or remove {jd.target_file}, to train "
                f"on)")
    return None


def _roll_back(checkpointer: Checkpointer, step: int) -> None:
    """Set the checkpoints after ``step`` aside: the run continues from ``step``, and they would
    be in the way of its saves."""
    later = [s for s in checkpointer.all_steps() if s > step]
    if not later:
        return
    moved = [checkpointer.set_aside(s, why="rolled_back") for s in later]
    if None in moved:
        raise UsageError(f"this checkpointer cannot set checkpoints aside, so the run cannot go "
                         f"back to step {step}; use another --job-dir")
    warn(f"restarting from step {step}: moved the later checkpoints (steps "
         f"{', '.join(map(str, later))}) to {job_path(moved[0]).parent}")


def _recorded(host: PluginHost, jd: JobDir, set_items: list[str]
              ) -> tuple[str, list[str], str | None]:
    """The experiment, overrides (then ``set_items``) and config file of the job's last run,
    for a command given no ``--exp``, provided they name only installed, registered code
    (``pax_core.config.trust``): a job directory is data, and may come from anyone."""
    last = jd.last_run()
    if last is None:
        raise UsageError(f"--job-dir {jd.path} has no recorded run; pass --exp")
    exp, set_items = last["experiment"], list(last["overrides"]) + list(set_items)
    trust.check_recorded_experiment(host, exp, str(jd.runs_file))
    config_file = None
    if last.get("config_file"):
        config_file = str(jd.path / "config.json")
        with contextlib.suppress(OSError, UnicodeDecodeError):  # unreadable: said later
            trust.check_config(host, job_path(config_file).read_text(), config_file)
    return exp, set_items, config_file


def restore_latest(host: PluginHost, *, exp: str | None, plugin: str | None,
                   set_items: list[str], job_dir: str, platform: str | None = None,
                   distributed: DistributedOptions | None = None, step: int | None = None
                   ) -> tuple[Run, TrainState, int]:
    """The run and the latest train state of a job (or that of ``step``), for commands that
    use a trained model (``pax eval``, a modality's ``pax decode``).

    Without ``exp`` the experiment and overrides recorded by the last ``pax train`` are used
    (and its config, for a run trained from a config file), provided they name only
    installed, registered code (``pax_core.config.trust``): a job directory is data, and may
    come from anyone.
    """
    jd = JobDir(job_dir)
    if not jd.has_checkpoints():
        raise UsageError(_no_checkpoint(jd))
    config_file = None
    if exp is None:
        exp, set_items, config_file = _recorded(host, jd, set_items)
    run = prepare_run(host, exp, plugin, set_items, jd, platform, distributed, config_file)
    checkpointer = run.make_checkpointer(str(jd.checkpoints), read_only=True)
    try:
        if not checkpointer.all_steps():  # step folders, none committed (a bucket's)
            raise UsageError(_no_checkpoint(jd))
        state, step = restore_or_init(host, run, checkpointer, step)
    finally:
        checkpointer.close()
    return run, state, step


def _no_checkpoint(jd: JobDir) -> str:
    """Why a job has nothing to restore: no save, or none that finished."""
    if jd.began_saving():
        return (f"no complete checkpoint in {jd.checkpoints} (a save was interrupted before "
                f"it finished); run pax train first")
    return f"no checkpoint in {jd.checkpoints}; run pax train first"


def evaluate(host: PluginHost, *, exp: str | None, plugin: str | None, set_items: list[str],
             job_dir: str, platform: str | None = None,
             distributed: DistributedOptions | None = None, step: int | None = None
             ) -> tuple[int, dict[str, dict[str, float]]]:
    """Evaluate the latest checkpoint in ``job_dir`` (or ``step``); returns (step, metrics per
    dataset)."""
    run, state, step = restore_latest(host, exp=exp, plugin=plugin, set_items=set_items,
                                      job_dir=job_dir, platform=platform,
                                      distributed=distributed, step=step)
    if not run.eval_inputs:
        raise UsageError(f"experiment {run.resolved.name} declares no eval datasets")
    return step, Evaluator(run, host).evaluate(run.eval_variables(state))


def harness_for(host: PluginHost, *, exp: str | None, plugin: str | None,
                set_items: list[str], job_dir: str) -> Registered:
    """The evaluation harness ``pax eval --harness`` runs the job through: the one registered
    by the plugin whose package defines the job's experiment class, else by the nearest base
    class's plugin that registers one. Found before JAX starts, so that a job no harness
    evaluates is refused at once."""
    if exp is None:
        exp, _, _ = _recorded(host, JobDir(job_dir), set_items)
    if plugin:
        host.require(plugin)
    name, cls = find_experiment(host.components("experiments"), exp, plugin)
    harnesses = host.components("harnesses")
    owners = [host.owner_of(base) for base in cls.__mro__]
    for owner in dict.fromkeys(o for o in owners if o is not None):
        own = [e for e in harnesses if e.plugin == owner]
        if len(own) > 1:
            raise RunError(f"plugin '{owner}' registers {len(own)} harnesses "
                           f"({', '.join(e.name for e in own)}); a plugin registers at most one")
        if own:
            return own[0]
    offered = sorted({f"{e.qualified_name} ({e.distribution})" for e in harnesses})
    others = (f"the harnesses installed ({', '.join(offered)}) evaluate their own plugins' "
              f"experiments" if offered else "no installed plugin registers one (pax-lm does, "
              "for language models: pip install 'pax-lm[harness]')")
    raise UsageError(f"--harness: no installed plugin provides a harness evaluation for "
                     f"experiment {name}; {others}")
