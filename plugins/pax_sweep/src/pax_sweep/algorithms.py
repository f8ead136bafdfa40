"""The search algorithms ``pax sweep --algorithm`` names, each a PyGlove ``DNAGenerator``
(propose a choice, take a reward, recover from a history): PyGlove's own, and OSS Vizier's
default designer where it is installed (``vizier.py``)."""

from __future__ import annotations

import math
from typing import Any

import pyglove as pg

from pax_core import UsageError

NAMES = ("grid", "random", "evolution", "vizier")
DEFAULT_TRIALS = 16


def budget(name: str, spec: pg.DNASpec, trials: int | None, declared: int | None) -> int:
    """How many trials: ``--trials``, else the space's ``max_trials``, else the whole grid
    (grid search) or ``DEFAULT_TRIALS``; never more than a finite space's size."""
    if name not in NAMES:
        raise UsageError(f"--algorithm {name}: use one of {', '.join(NAMES)}")
    size = spec.space_size  # -1 where a value is continuous
    if name == "grid" and size < 0:
        continuous = [str(dna_spec.location) for dna_spec in spec.decision_points
                      if isinstance(dna_spec, pg.geno.Float)]
        raise UsageError(f"grid search needs a finite space, but {', '.join(continuous)} "
                         f"ranges over floats: give it oneof([...]) values, or use "
                         f"--algorithm random")
    chosen = trials if trials is not None else declared
    if chosen is None:
        chosen = size if name == "grid" else DEFAULT_TRIALS
    if chosen < 1:
        raise UsageError(f"a sweep needs at least one trial, and its budget is {chosen} (the "
                         f"search space's max_trials, or --trials)")
    # A finite space has no more distinct choices to try than its size.
    return min(chosen, size) if size > 0 else chosen


def reward(value: float | None, goal: str) -> float | None:
    """A metric as PyGlove's reward, which it maximises (a metric to minimise is negated);
    None for a metric that is missing or not finite."""
    if value is None or not math.isfinite(value):
        return None
    return -value if goal == "minimize" else value


def dna_of(recorded: Any, spec: pg.DNASpec) -> pg.DNA:
    """A recorded trial's DNA (its JSON), bound to the sweep's spec as PyGlove's algorithms
    need (evolution mutates it)."""
    return pg.DNA.from_json(recorded).use_spec(spec)


def make(name: str, spec: pg.DNASpec, seed: int, trials: int) -> Any:
    """The algorithm, set up for ``spec``. Regularized evolution (Real et al., as Pax's
    tuning used it) gets a population of a quarter of the budget (2 to 100) and tournaments
    of a quarter of that (at least 2)."""
    if name == "grid":
        algorithm = pg.geno.Sweeping()
    elif name == "random":
        algorithm = pg.geno.Random(seed=seed)
    elif name == "vizier":
        from pax_sweep.vizier import VizierDesigner

        algorithm = VizierDesigner(seed=seed)
    else:
        population = max(2, min(100, trials // 4))
        algorithm = pg.evolution.regularized_evolution(
            pg.evolution.mutators.Uniform(seed=seed), population_size=population,
            tournament_size=max(2, population // 4), seed=seed)
    algorithm.setup(spec)
    return algorithm
