"""pax sweep --algorithm vizier: OSS Vizier's GP bandit behind PyGlove's interface (run by
nox -s vizier, which installs pax-core[vizier]; skipped where Vizier is not installed)."""

from __future__ import annotations

import csv
import math
import sys

import pyglove as pg
import pytest

from pax_core import UsageError
from pax_core.testing import run_pax
from pax_sweep import algorithms, space

SPACE = space.SearchSpace(values=space.parse_search(
    ["LR=floatv(1e-4, 1e-1, log)", "H=oneof([(8,), (32,)])"])).hyper()


def test_without_vizier_the_algorithm_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "vizier", None)
    with pytest.raises(UsageError, match=r"pip install 'pax-core\[vizier\]'"):
        algorithms.make("vizier", pg.dna_spec(SPACE), 0, 4)


def _closeness(dna: pg.DNA, best: float = 1e-2) -> float:
    """The reward of a made-up objective: best at LR = ``best``."""
    return -abs(math.log10(pg.materialize(SPACE, dna).LR) - math.log10(best))


def test_the_designer_learns_from_feedback_and_recovers():
    """Told 5 trials' rewards, the designer proposes near the learning rate they favour; a new
    one recovering the same 5 choices with rewards that favour another rate proposes near that
    one. A designer deaf to its rewards explores an end of the range instead (seen, with every
    reward the same: 1e-4 for the first, 0.1 for the second)."""
    pytest.importorskip("vizier")
    designer = algorithms.make("vizier", pg.dna_spec(SPACE), 0, 6)
    history = []
    spec = pg.dna_spec(SPACE)
    for _ in range(5):
        recorded = designer.propose().to_json()  # as the sweep records and feeds it back
        dna = algorithms.dna_of(recorded, spec)
        history.append(dna)
        designer.feedback(algorithms.dna_of(recorded, spec), _closeness(dna))
    assert _closeness(designer.propose()) > -0.3  # within a factor 2 of 1e-2
    again = algorithms.make("vizier", spec, 0, 6)
    again.recover((dna, _closeness(dna, best=1e-4)) for dna in history)
    assert again.num_proposals == 5 and again.num_feedbacks == 5
    assert _closeness(again.propose(), best=1e-4) > -0.3


def test_a_vizier_sweep_trains_its_trials(tmp_path):
    pytest.importorskip("vizier")
    sweep_dir = tmp_path / "s"
    result = run_pax("sweep", "--exp", "MlpSynthetic", "--sweep-dir", str(sweep_dir),
                     "--algorithm", "vizier", "--trials", "3", "--set", "NUM_TRAIN_STEPS=40",
                     timeout=600)
    assert result.returncode == 0, result.stderr
    with open(sweep_dir / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and {r["status"] for r in rows} == {"completed"}
