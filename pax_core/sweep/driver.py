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
import math
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyglove as pg

from pax_core.errors import Stopped, UsageError
from pax_core.plugins.host import PluginHost
from pax_core.sweep import algorithms, metrics, space
from pax_core.sweep.record import (
    COMPLETED,
    FAILED,
    INVALID,
    RUNNING,
    STOPPED_EARLY,
    SweepDir,
    Trial,
)
from pax_core.sweep.runners import TrialRunner, runner, trial_resources
from pax_core.sweep.stopping import EarlyStopping

POLL_S = 0.5
_STOPPED = (130, 143)


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


def _reward(value: float | None, goal: str) -> float | None:
    """PyGlove maximises: a metric to minimise is fed back negated."""
    if value is None or not math.isfinite(value):
        return None
    return -value if goal == "minimize" else value


def _last_pax_line(log: Path) -> str:
    """The one-line message a failed ``pax train`` ended with, else its last line."""
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
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
    """One invocation of a sweep: the space, the algorithm, the record and the runner."""

    def __init__(self, host: PluginHost, options: SweepOptions):
        from pax_core.config.resolve import choose

        chosen = choose(host, options.exp, options.plugin, list(options.set_items))
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
        self.stopping = (EarlyStopping(self.space.early_stop, self.space.metric,
                                       self.space.goal, self.spec)
                         if self.space.early_stop else None)
        self.host = host

    def run(self) -> list[Trial]:
        """Run the sweep to its budget; returns every trial."""
        with self.dir.lock():
            self.dir.write_definition(self.definition)
            trials = self.dir.trials()
            for trial in trials:
                if trial.status == COMPLETED:
                    self._judge(trial)
                    self.dir.save(trial)
            self.algorithm.recover(
                (pg.DNA.from_json(t.dna), _reward(t.metric, self.space.goal)) for t in trials)
            if self.stopping:
                self.stopping.recover([(t, self.dir.job_dir(t)) for t in trials])
            waiting = [t for t in trials if t.status in (RUNNING, INVALID)]
            pool = runner(self.host, self.options.runner, self.options.parallel,
                          self.options.platform)
            with _stop_requests() as stops:
                self._loop(trials, waiting, pool, stops)
            return trials

    def _loop(self, trials: list[Trial], waiting: list[Trial], pool: TrialRunner,
              stops: list[int]) -> None:
        running: dict[str, tuple[Trial, float]] = {}
        hopeless: set[str] = set()
        exhausted = False
        while True:
            if stops:
                self._stop(pool, running, stops[0])
            while len(running) < pool.slots and (waiting or (not exhausted and
                                                             len(trials) < self.budget)):
                trial = waiting.pop(0) if waiting else self._propose(trials)
                if trial is None:
                    exhausted = True
                    break
                self._start(pool, trial)
                running[trial.name] = (trial, time.monotonic())
            if not running:
                return
            for name, (trial, _) in running.items():
                if (self.stopping and name not in hopeless
                        and self.stopping.should_stop(trial, self.dir.job_dir(trial))):
                    hopeless.add(name)
                    pool.cancel(name)
            for name, code in pool.wait(POLL_S):
                trial, started = running.pop(name)
                trial.wall_sec += time.monotonic() - started
                if name in hopeless and code in (0, *_STOPPED):
                    self._stopped_early(trial)
                elif code in _STOPPED and not stops:
                    waiting.append(trial)  # stopped from outside: it resumes
                else:
                    self._ended(trial, code, pool, running)

    def _propose(self, trials: list[Trial]) -> Trial | None:
        try:
            dna = self.algorithm.propose()
        except StopIteration:
            return None
        chosen = pg.materialize(self.hyper, dna)
        trial = Trial(id=len(trials), dna=dna.to_json(), overrides=space.overrides(chosen))
        trials.append(trial)
        return trial

    def _start(self, pool: TrialRunner, trial: Trial) -> None:
        trial.status, trial.message = RUNNING, ""
        self.dir.save(trial)
        job = self.dir.job_dir(trial)
        args = ["--exp", self.options.exp]
        if self.options.plugin:
            args += ["--plugin", self.options.plugin]
        if self.options.platform:
            args += ["--platform", self.options.platform]
        for item in [*self.options.set_items, *trial.overrides]:
            args += ["--set", item]
        print(f"trial {trial.name} started: {' '.join(trial.overrides)}", flush=True)
        pool.start(trial.name, args, job, job / "output.log", self.resources)

    def _ended(self, trial: Trial, code: int, pool: TrialRunner,
               running: dict[str, tuple[Trial, float]]) -> None:
        log = self.dir.job_dir(trial) / "output.log"
        if code == 0:
            trial.status = COMPLETED
            self._judge(trial)
            self.dir.save(trial)
            if trial.metric is None:
                self._abandon(pool, running)
                reported = metrics.reported(self.dir.job_dir(trial))
                raise UsageError(
                    f"metric '{self.space.metric}' is not among trial {trial.name}'s metrics "
                    f"({', '.join(reported) or 'none'}); choose one with --metric (the trials "
                    f"so far are kept)")
            reward = _reward(trial.metric, self.space.goal)
            if reward is not None:
                self.algorithm.feedback(pg.DNA.from_json(trial.dna), reward)
            print(f"trial {trial.name} completed: {self.space.metric} = {trial.metric:.6g} "
                  f"({trial.steps} steps, {trial.wall_sec:.1f} s)", flush=True)
            return
        trial.message = _last_pax_line(log)
        trial.status = INVALID if code == 2 else FAILED
        self.dir.save(trial)
        if code == 2:
            self._abandon(pool, running)
            raise UsageError(f"trial {trial.name} ({' '.join(trial.overrides)}): "
                             f"{trial.message.removeprefix('pax: ')}")
        print(f"trial {trial.name} failed (exit {code}): {trial.message}; see {log}",
              flush=True)

    def _stopped_early(self, trial: Trial) -> None:
        """A trial the early-stopping rule stopped: its metric is the last it reached, and the
        algorithm is not told (a partial run's metric would mislead it)."""
        trial.status = STOPPED_EARLY
        self._judge(trial)
        self.dir.save(trial)
        print(f"trial {trial.name} stopped early at step {trial.steps}: {self.space.metric} = "
              f"{trial.metric:.6g}", flush=True)

    def _judge(self, trial: Trial) -> None:
        """Read the trial's metric (again: the sweep's metric may have changed)."""
        trial.metric, trial.steps = metrics.final(self.dir.job_dir(trial), self.space.metric)

    def _abandon(self, pool: TrialRunner, running: dict[str, tuple[Trial, float]]) -> None:
        """Stop the other running trials (each saves its checkpoint and resumes next time)."""
        pool.stop()
        for trial, started in running.values():
            trial.wall_sec += time.monotonic() - started
            self.dir.save(trial)

    def _stop(self, pool: TrialRunner, running: dict[str, tuple[Trial, float]],
              signum: int) -> None:
        self._abandon(pool, running)
        raise Stopped(f"sweep stopped on request ({signal.Signals(signum).name}); the running "
                      f"trials saved their checkpoints: run the same command to resume", signum)


def sweep(host: PluginHost, options: SweepOptions) -> list[Trial]:
    """Run (or resume) a sweep; returns its trials."""
    return Sweep(host, options).run()

