"""pax sweep: PyGlove search spaces over an experiment's constants, trials as real pax train
jobs, the results table and plot, resuming after a stop or a kill, and bad input."""

from __future__ import annotations

import csv
import json
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyglove as pg
import pytest

from pax_core import CpuBackend, UsageError, is_held
from pax_core.testing import read_metrics, run_pax, stop_once_saved
from pax_sweep import algorithms, results, space
from pax_sweep.record import (
    COMPLETED,
    FAILED,
    RUNNING,
    STOPPED_EARLY,
    SweepDir,
    Trial,
)

MLP = ["--exp", "MlpSynthetic", "--metric", "eval/test loss"]
# Short trials: 40 steps, a checkpoint at the end only.
SHORT = ["--set", "NUM_TRAIN_STEPS=40", "--set", "task.train.eval_interval_steps=40"]
# One trial, of the learning rate that the MLP learns well with (the experiment's own space
# searches the width too: one width here).
ONE = ["--search", "LEARNING_RATE=oneof([0.01])", "--search", "HIDDEN_DIMS=oneof([(32,)])"]


def _trials(sweep_dir: Path) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text())
            for p in sorted((sweep_dir / "trials").glob("*/trial.json"))}


def _results(sweep_dir: Path) -> list[dict[str, str]]:
    with open(sweep_dir / "results.csv") as f:
        return list(csv.DictReader(f))


def test_pax_cores_old_names_are_gone_since_api_1_13():
    """They warned through API 1.12 (moved to pax-sweep); 1.13 removed them, as announced."""
    import pax_core
    import pax_sweep

    for name in ("SearchSpace", "TrialRunner"):
        assert hasattr(pax_sweep, name)
        with pytest.raises(AttributeError, match=f"has no attribute '{name}'"):
            getattr(pax_core, name)


# The search space's words.

@pytest.mark.parametrize(("text", "expected"), [
    ("oneof([1, 2])", pg.oneof([1, 2])),
    ("floatv(1e-4, 0.1, log)", pg.floatv(1e-4, 0.1, scale="log")),
    ("floatv(0.0, 1.0)", pg.floatv(0.0, 1.0)),
    ("intv(2, 4)", pg.oneof([2, 3, 4])),
    ("manyof(2, ['a', 'b', 'c'])", pg.manyof(2, ["a", "b", "c"], sorted=True)),
    ("(64, 64)", (64, 64)),
])
def test_search_expressions_are_pyglove_hyper_values(text, expected):
    assert space.parse_search([f"KEY={text}"]) == {"KEY": expected}


@pytest.mark.parametrize(("item", "message"), [
    ("LR", "expected KEY=EXPR"),
    ("LR=floatv(1, 0.1)", "floatv needs LOW < HIGH"),
    ("LR=floatv(0, 1, log)", "LOW > 0 on a log scale"),
    ("LR=oneof([])", "non-empty list"),
    ("LR=oneof(rate)", "'rate' is not a Python literal"),
    ("LR=choice([1, 2])", "write oneof([A, B, ...])"),
    ("N=manyof(4, [1, 2])", "manyof needs a count from 1 to the number of candidates"),
])
def test_bad_search_expressions_say_what_is_wrong(item, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        space.parse_search([item])


@pytest.mark.parametrize("item", ["200", "0:0.5", "200:1.5", "x:0.5"])
def test_bad_early_stopping_gates_are_refused(item):
    with pytest.raises(UsageError, match="expected STEP:FRACTION"):
        space.parse_early_stop([item])


def test_a_search_file_holds_lines_as_the_command_line(tmp_path):
    path = tmp_path / "space.txt"
    path.write_text("# learning rate\nLEARNING_RATE=floatv(1e-4, 1e-1, log)\n\nN=intv(1, 2)\n")
    found = space.parse_search(["N=oneof([8])"], [str(path)])
    assert found == {"LEARNING_RATE": pg.floatv(1e-4, 1e-1, scale="log"), "N": pg.oneof([8])}


def test_trial_overrides_read_back_as_set_items():
    chosen = {"HIDDEN_DIMS": (8, 8), "LEARNING_RATE": 0.003, "TAGS": pg.List(["a", "b"])}
    assert space.overrides(chosen) == ["HIDDEN_DIMS=(8, 8)", "LEARNING_RATE=0.003",
                                       "TAGS=['a', 'b']"]


def test_trials_side_by_side_share_the_cpu_devices(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=false "
                                    "--xla_force_host_platform_device_count=8")
    assert CpuBackend().share(1, 2) == {
        "XLA_FLAGS": "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=4"}
    assert CpuBackend().share(0, 16)["XLA_FLAGS"].endswith("device_count=1")


# The algorithms as the sweep drives them: each proposal recorded as JSON and fed back (or
# replayed by ``recover`` on a resume) as DNA read from that JSON.
FEEDBACK_SPACE = space.SearchSpace(values=space.parse_search(
    ["LR=oneof([0.1, 0.01, 0.001, 0.0001])", "H=oneof([(8,), (16,), (32,)])"])).hyper()
FEEDBACK_SPEC = pg.dna_spec(FEEDBACK_SPACE)


def _reward(dna: pg.DNA, best_lr: float) -> float:
    """Highest at learning rate ``best_lr``, falling with the distance on a log scale."""
    return -abs(math.log10(pg.materialize(FEEDBACK_SPACE, dna).LR) - math.log10(best_lr))


def _sweep(algorithm, count: int, best_lr: float = 0.01) -> list[str]:
    """``count`` proposals, each recorded as JSON and fed back with its ``_reward``; returns
    the recorded JSON."""
    recorded = []
    for _ in range(count):
        recorded.append(json.dumps(algorithm.propose().to_json()))
        dna = algorithms.dna_of(json.loads(recorded[-1]), FEEDBACK_SPEC)
        algorithm.feedback(dna, _reward(dna, best_lr))
    return recorded


def _resumed(name: str, recorded: list[str], trials: int) -> object:
    """A new invocation's algorithm that recovered the recorded trials with their rewards."""
    again = algorithms.make(name, FEEDBACK_SPEC, seed=1, trials=trials)
    dnas = [algorithms.dna_of(json.loads(text), FEEDBACK_SPEC) for text in recorded]
    again.recover((dna, _reward(dna, 0.01)) for dna in dnas)
    return again


def test_grid_search_given_recorded_feedback_proposes_only_the_rest():
    """Grid search visits every point once: resumed on 5 recorded trials, it proposes the 7
    other points of the 12 and stops; a grid that forgot what was recorded starts over."""
    first = _sweep(algorithms.make("grid", FEEDBACK_SPEC, seed=1, trials=12), 5)
    again = _resumed("grid", first, 12)
    rest = [json.dumps(again.propose().to_json()) for _ in range(7)]
    with pytest.raises(StopIteration):
        again.propose()
    assert len(set(first + rest)) == 12, (first, rest)
    straight = _sweep(algorithms.make("grid", FEEDBACK_SPEC, seed=1, trials=12), 12)
    assert first + rest == straight  # in order, as one uninterrupted grid


def test_random_search_given_recorded_feedback_draws_what_follows_it():
    """Seeded random search, resumed on 5 recorded trials, goes on with the draws that follow
    them (as the uninterrupted sweep does) instead of drawing the recorded ones again."""
    straight = _sweep(algorithms.make("random", FEEDBACK_SPEC, seed=1, trials=10), 10)
    again = _resumed("random", straight[:5], 10)
    rest = [json.dumps(again.propose().to_json()) for _ in range(5)]
    assert rest == straight[5:]
    assert rest != straight[:5]


def test_evolution_given_feedback_breeds_from_the_best_recorded_choices():
    """Regularized evolution draws its first population (10 of a budget of 40) at random, then
    mutates tournament winners: with the same seed, sweeps whose rewards favour different
    learning rates share the first population, then each proposes its own best most often, and
    far more often than the other sweep does. An evolution deaf to its rewards would make the
    same proposals in both; one that cannot read the recorded DNA back fails to mutate it."""
    rates = {}
    for best in (0.1, 0.0001):
        recorded = _sweep(algorithms.make("evolution", FEEDBACK_SPEC, seed=1, trials=40), 40,
                          best_lr=best)
        rates[best] = [pg.materialize(FEEDBACK_SPACE,
                                      algorithms.dna_of(json.loads(text), FEEDBACK_SPEC)).LR
                       for text in recorded]
    assert rates[0.1][:10] == rates[0.0001][:10]
    for best, other in ((0.1, 0.0001), (0.0001, 0.1)):
        bred = rates[best][10:]  # each rate is a quarter of them where rewards are ignored
        assert bred.count(best) == max(bred.count(lr) for lr in set(bred)), (best, bred)
        assert bred.count(best) > 2 * rates[other][10:].count(best), (best, rates)


def _trial_record(sweep_dir: Path, trial: Trial, curve: list[tuple[int, float]]) -> None:
    SweepDir(sweep_dir).save(trial)
    lines = [{"step": 0, "kind": "start"}] + [
        {"step": step, "kind": "eval/test", "loss": value} for step, value in curve] + [
        {"step": step, "kind": "train", "loss": value + 0.1} for step, value in curve]
    job = sweep_dir / "trials" / trial.name
    (job / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))


def test_results_show_every_kind_of_trial(tmp_path):
    """Completed, stopped early, diverged (NaN), failed and running trials, list and dict
    values: ranked, written to CSV and drawn."""
    SweepDir(tmp_path).write_definition({
        "experiment": "core/MlpSynthetic", "set_items": [], "algorithm": "random", "seed": 0,
        "search": {"TAGS": "manyof(2, ['a', 'b', 'c'])", "OPT": "oneof([{'b1': 0.9}])"},
        "metric": "eval/test loss", "goal": "minimize", "trials": 5, "early_stop": []})
    sets = ["OPT={'b1': 0.9}", "TAGS=['a', 'b']"]
    cases = [(COMPLETED, [(10, 1.0), (20, 0.5)]), (STOPPED_EARLY, [(10, 0.9)]),
             (COMPLETED, [(10, 0.8), (20, math.nan)]), (FAILED, []), (RUNNING, [(10, 2.0)]),
             (COMPLETED, [(10, 0.7), (20, 0.3)])]
    for number, (status, curve) in enumerate(cases):
        _trial_record(tmp_path, Trial(id=number, dna=None, overrides=sets, status=status),
                      curve)
    table = results.show(SweepDir(tmp_path))
    assert [(row[0], row[-1]) for row in table] == [
        ("005", "completed"), ("000", "completed"), ("001", "stopped early"),
        ("002", "completed"), ("003", "failed"), ("004", "running")]
    assert table[0][1:3] == [{"b1": 0.9}, ["a", "b"]]
    rows = _results(tmp_path)
    assert rows[0]["eval/test loss"] == "0.3" and rows[3]["eval/test loss"] == "nan"
    assert (tmp_path / "results.png").stat().st_size > 10_000


# Real sweeps.

def test_grid_and_random_search_find_the_good_learning_rates(tmp_path):
    """Within 40 steps of Adam the MLP's held-out loss is lowest for a learning rate from 1e-2
    to 1e-1 (below 0.5, from 1.7 at the start); at 1e-3 and below it stays above 1. Grid
    search tries 6 pairs of learning rate and width; random search, 6 draws from the
    experiment's own space (log-uniform from 1e-4 to 1e-1)."""
    grid = tmp_path / "grid"
    result = run_pax("sweep", *MLP, *SHORT, "--sweep-dir", str(grid), "--algorithm", "grid",
                     "--search", "LEARNING_RATE=oneof([1e-4, 1e-3, 1e-2])",
                     "--search", "HIDDEN_DIMS=oneof([(8,), (64,)])", "--parallel", "2",
                     timeout=300)
    assert result.returncode == 0, result.stderr
    rows = _results(grid)
    assert len(rows) == 6 and {r["status"] for r in rows} == {"completed"}
    assert float(rows[0]["LEARNING_RATE"]) == 1e-2
    assert {float(r["LEARNING_RATE"]) for r in rows[-2:]} == {1e-4}
    assert [float(r["eval/test loss"]) for r in rows] == sorted(
        float(r["eval/test loss"]) for r in rows)
    assert "HIDDEN_DIMS" in result.stdout and (grid / "results.png").stat().st_size > 10_000

    rand = tmp_path / "random"
    result = run_pax("sweep", *MLP, *SHORT, "--sweep-dir", str(rand), "--trials", "6",
                     "--parallel", "2", "--seed", "3", timeout=300)
    assert result.returncode == 0, result.stderr
    rows = _results(rand)
    assert len(rows) == 6
    assert 1e-2 <= float(rows[0]["LEARNING_RATE"]) <= 1e-1
    assert float(rows[0]["eval/test loss"]) < 0.5


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGKILL])
def test_a_stopped_or_killed_sweep_resumes_without_running_a_finished_trial(tmp_path, signum):
    sweep_dir = tmp_path / "sweep"
    command = [str(Path(sys.executable).with_name("pax")), "sweep", *MLP, "--sweep-dir",
               str(sweep_dir), "--algorithm", "grid", "--search",
               "LEARNING_RATE=oneof([0.003, 0.01])", "--search", "HIDDEN_DIMS=oneof([(32,)])",
               "--set", "NUM_TRAIN_STEPS=1000", "--set", "task.train.save_interval_steps=100",
               "--set", "task.train.eval_interval_steps=1000"]
    second_trial = sweep_dir / "trials" / "001"
    first = stop_once_saved(command, second_trial, signum)
    if signum == signal.SIGINT:
        assert first.returncode == 130, first.stderr
        assert "run the same command to resume" in first.stderr
        assert "Traceback" not in first.stderr
    deadline = time.monotonic() + 120
    while is_held(second_trial / "train.lock"):  # after a kill, the trial saves and stops
        assert time.monotonic() < deadline, "the killed sweep's trial did not stop"
        time.sleep(0.2)
    trials = _trials(sweep_dir)
    assert trials["000"]["status"] == "completed" and trials["001"]["status"] == "running"
    finished = (sweep_dir / "trials" / "000" / "metrics.jsonl").read_text()

    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "trial 000 started" not in again.stdout and "trial 001 started" in again.stdout
    assert (sweep_dir / "trials" / "000" / "metrics.jsonl").read_text() == finished
    starts = [r["step"] for r in read_metrics(second_trial) if r["kind"] == "start"]
    assert starts[0] == 0 and starts[1] >= 100  # resumed from its checkpoint
    assert {t["status"] for t in _trials(sweep_dir).values()} == {"completed"}


def test_a_hopeless_trial_is_stopped_early_and_saved(tmp_path):
    """Three good learning rates reach step 200 first; the fourth, 1e-5, has barely moved
    there, outside the best half, and stops."""
    sweep_dir = tmp_path / "s"
    result = run_pax("sweep", *MLP, "--sweep-dir", str(sweep_dir), "--algorithm", "grid",
                     "--search", "LEARNING_RATE=oneof([0.01, 0.03, 0.1, 1e-5])",
                     "--search", "HIDDEN_DIMS=oneof([(32,)])", "--early-stop", "200:0.5",
                     "--set", "NUM_TRAIN_STEPS=1500", "--set",
                     "task.train.eval_interval_steps=100", "--set",
                     "task.train.save_interval_steps=500", timeout=300)
    assert result.returncode == 0, result.stderr
    trials = _trials(sweep_dir)
    assert [t["status"] for t in trials.values()] == ["completed"] * 3 + ["stopped early"]
    assert 200 <= trials["003"]["steps"] < 1500
    assert "trial 003 stopped early at step" in result.stdout
    saved = [int(p.name) for p in (sweep_dir / "trials" / "003" / "checkpoints").iterdir()
             if p.name.isdigit()]
    assert trials["003"]["steps"] <= max(saved) < 1500


# Bad input: one line, exit 2, nothing overwritten.

def _refused(*args: str) -> str:
    result = run_pax("sweep", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr


def test_an_empty_search_space_is_refused(tmp_path):
    message = _refused("--exp", "TinyCounting", "--metric", "train loss", "--sweep-dir",
                       str(tmp_path / "s"))
    assert "the search space is empty" in message
    assert not (tmp_path / "s").exists()


def test_an_unknown_constant_is_refused_naming_the_closest(tmp_path):
    message = _refused(*MLP, "--search", "LEARNIG_RATE=oneof([0.1, 0.2])", "--sweep-dir",
                       str(tmp_path / "s"))
    assert "LEARNIG_RATE is not a constant of experiment" in message
    assert "did you mean LEARNING_RATE?" in message


def test_grid_search_over_a_float_range_is_refused(tmp_path):
    message = _refused(*MLP, "--algorithm", "grid", "--sweep-dir", str(tmp_path / "s"))
    assert "grid search needs a finite space, but LEARNING_RATE ranges over floats" in message


def test_a_metric_no_trial_reports_and_another_sweep_in_the_folder(tmp_path):
    sweep_dir = tmp_path / "s"
    args = ["--exp", "MlpSynthetic", *SHORT, "--sweep-dir", str(sweep_dir), *ONE]
    message = _refused(*args, "--metric", "eval/test bleu")
    assert "metric 'eval/test bleu' is not among trial 000's metrics" in message
    assert "eval/test loss" in message
    record = (sweep_dir / "sweep.json").read_text()

    message = _refused(*args, "--search", "HIDDEN_DIMS=oneof([(4,)])", "--metric",
                       "eval/test loss")
    assert f"--sweep-dir {sweep_dir} holds another sweep (search:" in message
    message = _refused("--exp", "TinyCounting", "--sweep-dir", str(sweep_dir), "--search",
                       "LEARNING_RATE=oneof([0.01])", "--metric", "train loss")
    assert ("holds another sweep (experiment: core/MlpSynthetic, not "
            "testplugin/TinyCounting)") in message
    assert (sweep_dir / "sweep.json").read_text() == record

    fixed = run_pax("sweep", *args, "--metric", "eval/test loss")  # the same trial, judged
    assert fixed.returncode == 0, fixed.stderr
    assert "trial 000 started" not in fixed.stdout
    assert _trials(sweep_dir)["000"]["metric"] < 2


def test_a_first_trial_whose_settings_are_refused_leaves_nothing(tmp_path):
    message = _refused(*MLP, *SHORT, "--sweep-dir", str(tmp_path / "s"), *ONE, "--search",
                       "task.model.no_such_field=oneof([1])")
    assert "trial 000 (HIDDEN_DIMS=(32,) LEARNING_RATE=0.01 task.model.no_such_field=1)" in message
    assert "no_such_field" in message.split("):", 1)[1]
    assert not (tmp_path / "s").exists()


def test_a_file_given_as_the_sweep_folder_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    assert "is a file; give a folder" in _refused(*MLP, "--sweep-dir", str(tmp_path / "notes.txt"))
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_folder_that_holds_something_else_is_refused(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    message = _refused(*MLP, "--sweep-dir", str(tmp_path))
    assert "is not empty and holds no sweep" in message
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_show_without_a_sweep_is_refused(tmp_path):
    assert "holds no sweep" in _refused("--sweep-dir", str(tmp_path), "--show")


def test_show_reads_the_metric_again(tmp_path):
    sweep_dir = tmp_path / "s"
    result = run_pax("sweep", *MLP, *SHORT, "--sweep-dir", str(sweep_dir), *ONE)
    assert result.returncode == 0, result.stderr
    trial = SweepDir(sweep_dir).trials()[0]
    measured = trial.metric
    trial.metric = 123.0  # --show believes the trial's metrics, not this record
    SweepDir(sweep_dir).save(trial)
    shown = run_pax("sweep", "--sweep-dir", str(sweep_dir), "--show")
    assert shown.returncode == 0, shown.stderr
    assert "LEARNING_RATE" in shown.stdout and "completed" in shown.stdout
    assert float(_results(sweep_dir)[0]["eval/test loss"]) == measured != 123.0
