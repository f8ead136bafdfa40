"""The training loop.

It dispatches steps without waiting for them: metrics stay on the device until a summary step,
and the host only blocks on a step ``max_inflight_steps`` behind the newest, which bounds memory
without stalling the device. The step is compiled ahead of time, before the first batch is read,
which also gives the compiled program's FLOPs for HFU (and again for each further batch shape an
input gives: ``pax_core.run.compiled_steps``). Every summary reports speed (steps/s,
MFU, HFU) and where the time went (``pax_core.speed.clock``). A SIGTERM or Ctrl-C finishes the
current step, saves a checkpoint and stops cleanly; running the same command again resumes.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import signal
from typing import Any

import jax

from pax_core.checkpointers.base import Checkpointer
from pax_core.errors import PaxError, RunError, warn
from pax_core.loggers import LoggerGroup
from pax_core.loggers.console import format_value
from pax_core.plugins.host import PluginHost
from pax_core.plugins.notify import RunInfo, notify
from pax_core.run import stop_requests
from pax_core.run.build import Run
from pax_core.run.compiled_steps import TrainSteps
from pax_core.run.evaluation import Evaluator
from pax_core.run.host_memory import release_freed_memory
from pax_core.run.memory_use import memory_metrics
from pax_core.run.state import TrainState, count_params
from pax_core.speed.clock import StepClock, Utilisation, process_age
from pax_core.speed.peak import device_peak
from pax_core.speed.profiling import StepProfiler


@contextlib.contextmanager
def _stop_on_signals(flag: dict[str, int], coordinated: bool):
    """Turn SIGTERM/SIGINT into a request to stop after the current step (``flag["stop"]`` is
    the signal's number). A repeated request is acknowledged, not obeyed: the checkpoint being
    written must finish, or the previous one would stay the latest.

    In a multi-process run (``coordinated``) every process must stop at the same step, since
    the save is collective: SIGTERM is left to JAX's preemption service, which tells the other
    processes and names the step all of them stop at (``reached_preemption_sync_point``), and
    a Ctrl-C is passed to it as a SIGTERM to this process."""

    def handler(signum, frame):
        if flag["stop"] or flag.get("requested"):
            warn(f"{signal.Signals(signum).name} again: still saving the checkpoint, then "
                 f"stopping")
        elif coordinated:
            flag["requested"] = signum
            os.kill(os.getpid(), signal.SIGTERM)
        else:
            flag["stop"] = signum

    handled = (signal.SIGINT,) if coordinated else (signal.SIGTERM, signal.SIGINT)
    previous = {s: signal.signal(s, handler) for s in handled}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@dataclasses.dataclass(frozen=True)
class TrainLoopOptions:
    """What ``pax train``'s own options change in the loop: the peak FLOP/s MFU is measured
    against (None: the device's), a window of steps to profile, and whether the eval datasets
    are evaluated during training (Pax's ``--eval_on_test``), and whether the console's step
    lines show every metric (``--verbose``)."""

    peak_tflops: float | None = None
    profile_steps: tuple[int, int] | None = None
    evaluate: bool = True
    verbose: bool = False


class TrainLoop:
    """Steps, summaries, evals and checkpoints of one invocation of ``pax train``: built (which
    compiles the step) before the train state exists, then ``run_loop`` from that state."""

    def __init__(self, run: Run, checkpointer: Checkpointer, host: PluginHost,
                 options: TrainLoopOptions = TrainLoopOptions()):
        # Compiling before the state exists keeps the compiler from competing with an
        # initialisation running in the background for the host's cores.
        self.run, self.checkpointer = run, checkpointer
        self.host, self.pm = host, host.pm
        self.settings = run.task.train
        self.train_steps = TrainSteps(run, host)
        mesh = run.partitioner.mesh
        self.utilisation = Utilisation(
            self.train_steps.first_flops,
            device_peak(list(mesh.devices.flat), options.peak_tflops), mesh.size)
        self.evaluator = Evaluator(run, host)
        self.clock = StepClock()
        self.profile_steps = options.profile_steps
        self.evaluates = options.evaluate and bool(run.eval_inputs)
        self.verbose = options.verbose
        self._first_step: dict[str, float] = {}
        self.stop_signal = 0
        self.target_reached: tuple[int, str] | None = None
        # Per-step "loss or gradients not finite" flags not yet read: (step, device scalar);
        # and how many steps were skipped since the last summary.
        self._anomalies: list[tuple[int, jax.Array]] = []
        self._skipped = 0
        self._uncommitted: list[int] = []

    def _log(self, step: int, kind: str, metrics: dict[str, float]) -> None:
        self.loggers.write(step, kind, metrics)
        notify(self.pm, "pax_on_metrics", run=self.info, step=step, kind=kind, metrics=metrics)

    def _check_anomalies(self) -> None:
        """Read the anomaly flags of the steps since the last check and count them into
        ``skipped_steps``. Under ``on_anomaly='stop'`` any is the end of the run, before the
        state that holds it could be evaluated or saved."""
        flags = jax.device_get([flag for _, flag in self._anomalies])
        bad = [step for (step, _), flag in zip(self._anomalies, flags, strict=True) if flag > 0]
        self._anomalies = []
        if bad and self.settings.learner.on_anomaly == "stop":
            self.checkpointer.wait()
            latest = self.checkpointer.latest_step()
            kept = (f"the newest checkpoint, step {latest}, is from before it" if latest
                    is not None else "no checkpoint was saved")
            raise RunError(
                f"training diverged: the loss or the gradients were not finite at step "
                f"{bad[0]} ({len(bad)} of the steps up to {bad[-1]}); {kept}. Lower the "
                f"learning rate, or set task.train.learner.on_anomaly='skip' to skip such "
                f"updates")
        self._skipped += len(bad)

    def _summarise(self, step: int, metrics: dict[str, jax.Array]) -> None:
        self._check_anomalies()
        values = {k: float(v) for k, v in jax.device_get(metrics).items() if k != "anomalous"}
        if self.settings.learner.on_anomaly == "skip":  # since the previous summary
            values["skipped_steps"], self._skipped = float(self._skipped), 0
        steps_per_sec, breakdown = self.clock.lap(step - self._last_summary_step)
        self._last_summary_step = step
        values["steps_per_sec"] = steps_per_sec
        values["examples_per_sec"] = steps_per_sec * self.run.train_input.batch_size
        tokens = values.pop("num_tokens")
        if tokens > 0:
            values["tokens_per_sec"] = steps_per_sec * tokens
        values.update(self.utilisation.metrics(steps_per_sec,
                                               self.train_steps.flops_since_last()))
        values.update(breakdown)
        values.update(memory_metrics(jax.local_devices(), self.train_steps.working_bytes))
        values.update(self._first_step)  # once per invocation, at its first summary
        self._first_step = {}
        self._log(step, "train", values)

    def _evaluate(self, step: int, state: TrainState) -> dict[str, dict[str, float]]:
        if not self.evaluates:
            return {}
        self._check_anomalies()
        results = self.evaluator.evaluate(self.run.eval_variables(state))
        for name, metrics in results.items():
            self._log(step, f"eval/{name}", metrics)
        return results

    def _check_target(self, step: int, results: dict[str, dict[str, float]]) -> bool:
        """Whether the eval ``results`` reach the early-stopping target (noted in
        ``self.target_reached``: the step and what was reached)."""
        early = self.settings.early_stopping
        if early is None or not results:
            return False
        metrics = results[early.dataset]
        if early.metric not in metrics:
            raise RunError(f"task.train.early_stopping watches {early.metric} of eval/"
                           f"{early.dataset}, which its eval does not report (it reports "
                           f"{', '.join(sorted(metrics))}); set early_stopping.metric to one "
                           f"of them")
        if early.reached(metrics[early.metric]):
            self.target_reached = (step, early.describe(metrics[early.metric]))
        return self.target_reached is not None

    def _checkpointer(self, method: str, *args: Any) -> Any:
        """A call of the checkpointer; its failures are reported against it (a storage failure
        it has already told as one line passes as is)."""
        try:
            return getattr(self.checkpointer, method)(*args)
        except PaxError:
            raise
        except Exception as e:
            raise self.host.provider_error("checkpointer", self.checkpointer, e) from e

    def _save(self, step: int, state: TrainState) -> None:
        self._check_anomalies()
        started = self._checkpointer("save", step, state, self.run.train_input.get_state())
        if started:
            # Starting a save waited for the earlier ones: they are committed now.
            self._announce_committed()
            self._uncommitted.append(step)

    def _announce_committed(self) -> None:
        for step in self._uncommitted:
            notify(self.pm, "pax_on_checkpoint_saved", run=self.info, step=step,
                   directory=self.checkpointer.directory)
        self._uncommitted = []

    def _next_batch(self, step: int) -> dict[str, jax.Array]:
        try:
            local = self.run.train_input.get_next()
        except StopIteration:
            raise RunError(f"training input '{self.run.train_input.name}' ran out at step "
                           f"{step}; make it repeat or lower task.train.num_train_steps") from None
        except Exception as e:
            raise self.host.provider_error("input", self.run.train_input, e) from e
        return self.run.partitioner.global_batch(local)

    def run_loop(self, start: list[TrainState], info: RunInfo, loggers: LoggerGroup,
                 config_text: str) -> tuple[TrainState, int, str]:
        """Train from ``info.start_step`` to ``num_train_steps``; returns (state, step, status).

        ``start`` holds the state to train from, and the steps take it out: were it an argument,
        the callers' frames would keep it alive until the end, beside the states the steps
        make (no train state is donated on a CPU)."""
        self.info, self.loggers = info, loggers
        step, total = info.start_step, self.settings.num_train_steps
        self._last_summary_step = step
        profiler = StepProfiler(self.profile_steps, info.job_dir)
        self.loggers.start(experiment=self.info.experiment, start_step=step,
                           num_train_steps=total, hparams=self._hparams())
        self.loggers.text(step, "config", config_text)
        notify(self.pm, "pax_on_train_start", run=self.info)
        profiler.check_window(step, total)
        flag = {"stop": stop_requests.requested()}  # one that arrived while it started
        # The first step's time is its own: the state (initialised or restored) is ready first.
        jax.block_until_ready(start)
        release_freed_memory()  # what compiling and restoring left in the heap
        with _stop_on_signals(flag, coordinated=jax.process_count() > 1):
            with contextlib.closing(profiler):
                state, step = self._steps(start, step, flag, profiler)
            self.stop_signal = flag["stop"]
            status = "interrupted" if self.stop_signal else "completed"
            self._save(step, state)
            if status == "completed" and self.target_reached is None:
                self._evaluate(step, state)
            self._checkpointer("wait")
        self._announce_committed()
        return state, step, status

    def _steps(self, start: list[TrainState], step: int, flag: dict[str, int],
               profiler: StepProfiler) -> tuple[TrainState, int]:
        """Steps until ``num_train_steps`` or a stop request, with summaries, evals and saves,
        from the state taken out of ``start``."""
        state = start.pop()
        total, settings, clock = self.settings.num_train_steps, self.settings, self.clock
        inflight: collections.deque = collections.deque()
        clock.restart()
        while step < total and not flag["stop"]:
            batch = self._next_batch(step)
            clock.charge("input")
            with profiler.step(step + 1):
                state, metrics = self.train_steps(state, batch)
            step += 1
            if self._preempted(step):
                flag["stop"] = signal.SIGTERM
            self._anomalies.append((step, metrics["anomalous"]))
            profiler.finished(step, metrics)
            inflight.append(metrics["loss"])
            if len(inflight) > settings.max_inflight_steps:
                inflight.popleft().block_until_ready()
            if step == self.info.start_step + 1:
                self._time_first_step(metrics)
            self.loggers.progress(step)
            if step % settings.summary_interval_steps == 0 or step == total:
                self._summarise(step, metrics)
            clock.charge("step")
            if step % settings.eval_interval_steps == 0 and step < total:
                reached = self._check_target(step, self._evaluate(step, state))
                clock.charge("eval")
                if reached:  # run_loop saves this step
                    break
            if self.checkpointer.should_save(step):
                self._save(step, state)
            self._checkpointer("check")
            clock.charge("checkpoint")
        return state, step

    def _preempted(self, step: int) -> bool:
        """Whether every process of a multi-process run has been told to stop at ``step`` (one of
        them got SIGTERM); a local check, made after every step as JAX requires."""
        if jax.process_count() == 1:
            return False
        from jax.experimental import multihost_utils

        return multihost_utils.reached_preemption_sync_point(step)

    def _time_first_step(self, metrics: dict[str, jax.Array]) -> None:
        """Compiling plus running the first step, and the process's launch to the end of it:
        what a user waits for before training."""
        jax.block_until_ready(metrics)
        self.clock.charge("step")
        self._first_step = {"first_step_sec": self.train_steps.compile_sec
                            + self.clock.spent("step")}
        age = process_age()
        if age is not None:
            self._first_step["startup_sec"] = age

    def _hparams(self) -> dict[str, Any]:
        train = self.settings
        return {
            "experiment": self.info.experiment,
            "num_params": count_params(self.run.abstract_state.params),
            "global_batch_size": self.run.train_input.batch_size,
            "num_devices": self.run.partitioner.mesh.size,
            "num_train_steps": train.num_train_steps,
            "learning_rate": train.learner.optimizer.learning_rate,
            "num_microbatches": train.learner.num_microbatches,
            **self.utilisation.settings(),
            **self._placement(),
            "mesh_layout": self.run.mesh_layout,
            "compilation_cache": self.run.compilation_cache,
            **({"presets": self.run.presets} if self.run.presets else {}),
            **({"fitted": self.run.fitted} if self.run.fitted else {}),
            **({"eval_metric": f"eval/{self.run.eval_inputs[0].name} {train.eval_metric}"}
               if self.evaluates else {}),
            **({"verbose": True} if self.verbose else {}),
        }

    def _placement(self) -> dict[str, Any]:
        """The partitioner's facts about this run (``describe``), and ``placement``: the same on
        one line, which the console prints at the start."""
        facts = self.run.partitioner.describe(self.run.train_input.batch_size)
        if not facts:
            return {}
        line = ", ".join(f"{name}={format_value(value) if isinstance(value, float) else value}"
                         for name, value in facts.items())
        return {**facts, "placement": line}
