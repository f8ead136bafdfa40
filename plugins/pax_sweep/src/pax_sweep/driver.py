"""``pax sweep``: trials proposed by a PyGlove algorithm, trained by a trial runner, judged by
a metric from their own ``metrics.jsonl``, and fed back.

The sweep directory is the sweep's whole state (``record.py``): an invocation replays the
recorded trials into the algorithm (PyGlove's ``recover``, rewards read again from the trials'
metrics), starts again every trial that had not ended (it resumes from its checkpoint, as any
``pax train`` does), and proposes new ones up to the budget. Ctrl-C or SIGTERM stop the
running trials as they would stop ``pax train`` (each saves its checkpoint), and the same
command resumes.
"""

from __future__ import annotations

import dataclasses
import shutil
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyglove as pg

from pax_core import PluginHost, Stopped, UsageError, choose_experiment, is_held
from pax_sweep import algorithms, metrics, space
from pax_sweep.record import (
    COMPLETED,
    FAILED,
    INVALID,
    RUNNING,
    STOPPED_EARLY,
    SweepDir,
    Trial,
)
from pax_sweep.runners import runner, trial_resources
from pax_sweep.stopping import EarlyStopping

POLL_S = 0.5
STOPPED = (130, 143)  # a trial that saved its checkpoint and stopped: it resumes
# A trial stopped from outside (its node lost, a scheduler's SIGTERM) is started again at most
# this many times in one invocation.
RESTARTS = 3


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """What ``pax sweep`` was asked (its flags, one field each)."""

    exp: str
    sweep_dir: str
    plugin: str | None = None
    set_items: tuple[str, ...] = ()
    search_items: tuple[str, ...] = ()
    search_files: tuple[str, ...] = ()
    metric: str | None = None
    goal: str | None = None
    early_stop: tuple[str, ...] = ()
    algorithm: str = "random"
    trials: int | None = None
    parallel: int = 1
    runner: str = "local"
    seed: int = 0
    platform: str | None = None


@dataclasses.dataclass
class _Active:
    """A trial the runner is training: since when, where this run's output starts in its log,
    and whether the early-stopping rule has stopped it."""

    trial: Trial
    started: float
    log_offset: int
    hopeless: bool = False


def _last_pax_line(log: Path, offset: int) -> str:
    """The one-line message a failed ``pax train`` ended with, else its last line, from what
    it printed after ``offset`` (its log holds earlier runs too)."""
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    said = [ln for ln in lines if ln.startswith("pax:")]
    return (said or lines or [""])[-1][:300]


@contextmanager
def _stop_requests() -> Iterator[list[int]]:
    """SIGINT and SIGTERM noted instead of obeyed at once: the sweep then stops its trials."""
    received: list[int] = []
    handler = lambda signum, frame: received.append(signum)  # noqa: E731
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for s, h in old.items():
            signal.signal(s, h)


class Sweep:
    """One invocation of a sweep: the space, the algorithm, the record and the runner. Every
    check that can refuse the command runs here, before anything is written."""

    def __init__(self, host: PluginHost, options: SweepOptions):
        chosen = choose_experiment(host, options.exp, options.plugin, list(options.set_items))
        self.options = options
        self.space = space.combine(
            chosen.experiment.search(),
            space.parse_search(list(options.search_items), list(options.search_files)),
            options.metric, options.goal, space.parse_early_stop(list(options.early_stop)))
        space.check_keys(self.space, chosen.name, type(chosen.experiment).constants())
        self.hyper = self.space.hyper()
        self.spec = pg.dna_spec(self.hyper)
        self.budget = algorithms.budget(options.algorithm, self.spec, options.trials,
                                        self.space.max_trials)
        self.algorithm = algorithms.make(options.algorithm, self.spec, options.seed,
                                         self.budget)
        self.resources = trial_resources(chosen.experiment, options.platform)
        self.dir = SweepDir(options.sweep_dir)
        self.definition = {
            "experiment": chosen.name, "set_items": list(options.set_items),
            "search": self.space.describe(), "algorithm": options.algorithm,
            "seed": options.seed, "metric": self.space.metric, "goal": self.space.goal,
            "trials": self.budget, "early_stop": [list(g) for g in self.space.early_stop]}
        self.dir.check_same_sweep(self.definition)
        self.fresh = self.dir.definition() is None  # this invocation makes the sweep
        self.made = not self.dir.path.exists()
        self.stopping = (EarlyStopping(self.space.early_stop, self.space.metric,
                                       self.space.goal, self.spec)
                         if self.space.early_stop else None)
        self.pool = runner(host, options.runner, options.parallel, options.platform)
        self._active: dict[str, _Active] = {}
        self._restarts: dict[int, int] = {}
        self._discard = False  # whether a refusal removes what this invocation wrote

    def run(self) -> list[Trial]:
        """Run the sweep to its budget; returns every trial."""
        with self.dir.lock():
            self.dir.check_same_sweep(self.definition)  # again, now that no other can write
            self.dir.write_definition(self.definition)
            trials = self.dir.trials()
            for trial in trials:
                if trial.status in (COMPLETED, STOPPED_EARLY):
                    self._judge(trial)
                    self.dir.save(trial)
            # A trial stopped early is not told to the algorithm (its metric is partial).
            self.algorithm.recover(
                (algorithms.dna_of(t.dna, self.spec),
                 algorithms.reward(t.metric, self.space.goal) if t.status == COMPLETED else None)
                for t in trials)
            if self.stopping:
                self.stopping.recover([(t, self.dir.job_dir(t)) for t in trials])
            waiting = [t for t in trials if t.status == RUNNING]
            with _stop_requests() as stops:
                try:
                    self._loop(trials, waiting, stops)
                except BaseException:
                    self._abandon()
                    raise
            return trials

    def _loop(self, trials: list[Trial], waiting: list[Trial], stops: list[int]) -> None:
        exhausted = False
        while True:
            if stops:
                self._stop(stops[0])
            while len(self._active) < self.pool.slots and (
                    waiting or (not exhausted and len(trials) < self.budget)):
                trial = waiting.pop(0) if waiting else self._propose(trials)
                if trial is None:
                    exhausted = True
                    break
                self._start(trial, stops)
            if not self._active:
                return
            self._judge_running()
            refusal = None
            for name, code in self.pool.wait(POLL_S):
                active = self._active.pop(name)
                active.trial.wall_sec += time.monotonic() - active.started
                refusal = self._ended(active, code, trials, waiting, stops) or refusal
            if refusal:
                self._abandon()
                if self._discard:
                    self._unmake()
                raise refusal

    def _judge_running(self) -> None:
        """Cancel the running trials the early-stopping rule finds hopeless."""
        for name, active in self._active.items():
            if (self.stopping and not active.hopeless
                    and self.stopping.should_stop(active.trial, self.dir.job_dir(active.trial))):
                active.hopeless = True
                self.pool.cancel(name)

    def _propose(self, trials: list[Trial]) -> Trial | None:
        try:
            dna = self.algorithm.propose()
        except StopIteration:
            return None
        chosen = pg.materialize(self.hyper, dna)
        number = max((t.id for t in trials), default=-1) + 1
        trial = Trial(id=number, dna=dna.to_json(), overrides=space.overrides(chosen))
        trials.append(trial)
        return trial

    def _start(self, trial: Trial, stops: list[int]) -> None:
        job = self.dir.job_dir(trial)
        if is_held(job / "train.lock"):
            # A sweep killed outright: its trial is still saving its checkpoint.
            print(f"trial {trial.name}: waiting for its earlier run to stop", flush=True)
            while is_held(job / "train.lock") and not stops:
                time.sleep(POLL_S)
            if stops:
                return  # it stays running in the record, for the next invocation
        trial.status, trial.message = RUNNING, ""
        self.dir.save(trial)
        args = ["--exp", self.options.exp]
        if self.options.plugin:
            args += ["--plugin", self.options.plugin]
        if self.options.platform:
            args += ["--platform", self.options.platform]
        for item in [*self.options.set_items, *trial.overrides]:
            args += ["--set", item]
        log = job / "output.log"
        print(f"trial {trial.name} started: {' '.join(trial.overrides)}", flush=True)
        self._active[trial.name] = _Active(trial, time.monotonic(),
                                           log.stat().st_size if log.exists() else 0)
        self.pool.start(trial.name, args, job, log, self.resources)

    def _ended(self, active: _Active, code: int, trials: list[Trial], waiting: list[Trial],
               stops: list[int]) -> UsageError | None:
        """Record how a trial ended; a usage error that must stop the sweep is returned, to be
        raised once every trial that ended with it is recorded."""
        trial = active.trial
        if active.hopeless and code in STOPPED:
            self._stopped_early(trial)
        elif code in STOPPED:
            self.dir.save(trial)  # still running: it resumes from its checkpoint
            if stops:
                return None
            restarts = self._restarts[trial.id] = self._restarts.get(trial.id, 0) + 1
            if restarts <= RESTARTS:
                waiting.append(trial)  # stopped from outside
                return None
            self._failed(trial, code, f"stopped from outside {restarts} times")
        elif code == 0:
            return self._completed(trial)
        elif code == 2:
            return self._invalid(trial, active.log_offset, trials)
        else:
            log = self.dir.job_dir(trial) / "output.log"
            self._failed(trial, code, f"{_last_pax_line(log, active.log_offset)}; see {log}")
        return None

    def _completed(self, trial: Trial) -> UsageError | None:
        trial.status = COMPLETED
        self._judge(trial)
        self.dir.save(trial)
        if trial.metric is None:
            reported = metrics.reported(self.dir.job_dir(trial))
            return UsageError(
                f"metric '{self.space.metric}' is not among trial {trial.name}'s metrics "
                f"({', '.join(reported) or 'none'}); choose one with --metric (the trials so "
                f"far are kept)")
        reward = algorithms.reward(trial.metric, self.space.goal)
        if reward is not None:
            self.algorithm.feedback(algorithms.dna_of(trial.dna, self.spec), reward)
        print(f"trial {trial.name} completed: {self.space.metric} = {trial.metric:.6g} "
              f"({trial.steps} steps, {trial.wall_sec:.1f} s)", flush=True)
        return None

    def _invalid(self, trial: Trial, offset: int, trials: list[Trial]) -> UsageError | None:
        """A trial whose settings ``pax train`` refused. Before any trial has completed that is
        the sweep's own mistake (a config path that does not exist, say): it stops, leaving no
        folder it made. Later, only these values are: the trial is left out, the sweep goes
        on."""
        message = _last_pax_line(self.dir.job_dir(trial) / "output.log", offset)
        trial.status, trial.message = INVALID, message.removeprefix("pax: ")
        self.dir.save(trial)
        if any(t.status == COMPLETED for t in trials):
            print(f"trial {trial.name} left out: {trial.message}", flush=True)
            return None
        self._discard = self.fresh
        return UsageError(f"trial {trial.name} ({' '.join(trial.overrides)}): "
                          f"{trial.message}")

    def _unmake(self) -> None:
        """Remove what this invocation wrote into a sweep directory it found without a sweep
        (the folder too, where it made it)."""
        if self.made:
            shutil.rmtree(self.dir.path, ignore_errors=True)
            return
        shutil.rmtree(self.dir.trials_dir, ignore_errors=True)
        (self.dir.path / "sweep.json").unlink(missing_ok=True)

    def _failed(self, trial: Trial, code: int, message: str) -> None:
        trial.status, trial.message = FAILED, message
        self.dir.save(trial)
        print(f"trial {trial.name} failed (exit {code}): {message}", flush=True)

    def _stopped_early(self, trial: Trial) -> None:
        """A trial the early-stopping rule stopped: its metric is the last it reached, and the
        algorithm is not told (a partial run's metric would mislead it)."""
        trial.status = STOPPED_EARLY
        self._judge(trial)
        self.dir.save(trial)
        print(f"trial {trial.name} stopped early at step {trial.steps}: {self.space.metric} = "
              f"{trial.metric}", flush=True)

    def _judge(self, trial: Trial) -> None:
        """Read the trial's metric (again: the sweep's metric may have changed)."""
        trial.metric, trial.steps = metrics.final(self.dir.job_dir(trial), self.space.metric)

    def _abandon(self) -> None:
        """Stop the running trials (each saves its checkpoint and resumes next time; one the
        early-stopping rule had stopped stays stopped)."""
        self.pool.stop()
        for active in self._active.values():
            active.trial.wall_sec += time.monotonic() - active.started
            if active.hopeless:
                self._stopped_early(active.trial)
            else:
                self.dir.save(active.trial)
        self._active.clear()

    def _stop(self, signum: int) -> None:
        self._abandon()
        raise Stopped(f"sweep stopped on request ({signal.Signals(signum).name}); the running "
                      f"trials saved their checkpoints: run the same command to resume", signum)


def sweep(host: PluginHost, options: SweepOptions) -> list[Trial]:
    """Run (or resume) a sweep; returns its trials."""
    return Sweep(host, options).run()
