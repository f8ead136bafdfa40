"""Early stopping of hopeless trials: PyGlove's rank rule over the sweep's metric.

At each gate ``(STEP, FRACTION)``, a trial whose metric at STEP is outside the best FRACTION of
the trials that reached STEP before it is stopped there (as Ctrl-C stops ``pax train``: it
saves its checkpoint), once ``MIN_REPORTED`` trials have. Every algorithm works with it: the
rule judges the trial's own curve, not its choice.
"""

from __future__ import annotations

import math
from pathlib import Path

import pyglove as pg

from pax_sweep import algorithms, metrics
from pax_sweep.record import COMPLETED, STOPPED_EARLY, Trial
from pax_sweep.space import MIN_REPORTED


class EarlyStopping:
    """The rule for one sweep invocation; ``recover`` first, then ``should_stop`` as trials
    report."""

    def __init__(self, gates: tuple[tuple[int, float], ...], metric: str, goal: str,
                 spec: pg.DNASpec):
        self._metric, self._goal = metric, goal
        self._policy = pg.early_stopping.early_stop_by_rank(
            [(step, fraction, MIN_REPORTED) for step, fraction in gates])()
        self._policy.setup(spec)
        self._seen: dict[int, int] = {}  # trial id -> size of its metrics when last read

    def _measured(self, trial: Trial, job_dir: Path, status: str) -> pg.tuning.Trial:
        return pg.tuning.Trial(
            id=trial.id, dna=pg.DNA.from_json(trial.dna), status=status, created_time=0,
            measurements=[pg.tuning.Measurement(step=step, reward=self._reward(value),
                                                elapse_secs=0.0)
                          for step, value in metrics.curve(job_dir, self._metric)])

    def _reward(self, value: float) -> float:
        """A diverged (non-finite) metric is the worst there is: its trial is the first to
        go."""
        reward = algorithms.reward(value, self._goal)
        return -math.inf if reward is None else reward

    def recover(self, trials: list[tuple[Trial, Path]]) -> None:
        """Replay the curves of the trials that ended (the gates' histories)."""
        self._policy.recover([self._measured(t, job, "COMPLETED") for t, job in trials
                              if t.status in (COMPLETED, STOPPED_EARLY)])

    def should_stop(self, trial: Trial, job_dir: Path) -> bool:
        """Whether a running trial's newest measurement fails a gate (its metrics are read
        again only when they have grown)."""
        path = job_dir / "metrics.jsonl"
        size = path.stat().st_size if path.exists() else 0
        if size == self._seen.get(trial.id):
            return False
        self._seen[trial.id] = size
        measured = self._measured(trial, job_dir, "PENDING")
        return bool(measured.measurements) and self._policy.should_stop_early(measured)
