"""`pax train` end to end through the installed command, as a user runs it."""

from __future__ import annotations

import itertools
import json

import fiddle as fdl
from fiddle.experimental import serialization

from pax_core.testing import read_metrics, run_pax


def test_train_learns_checkpoints_and_resumes(tmp_path):
    job_dir = tmp_path / "job"
    first = run_pax("train", "--plugin", "testplugin", "--exp", "TinyCounting",
                    "--job-dir", str(job_dir))
    assert first.returncode == 0, first.stderr
    assert "starting at step 0 of 60" in first.stdout

    train = [r for r in read_metrics(job_dir) if r["kind"] == "train"]
    assert [r["step"] for r in train] == [10, 20, 30, 40, 50, 60]
    assert train[-1]["loss"] < 0.5 * train[0]["loss"]
    assert {"learning_rate", "grad_norm", "steps_per_sec", "examples_per_sec",
            "tokens_per_sec", "accuracy"} <= set(train[-1])
    assert [r["step"] for r in read_metrics(job_dir) if r["kind"] == "eval/test"] == [30, 60]
    assert sorted(p.name for p in (job_dir / "checkpoints").iterdir()) == ["40", "60"]
    assert any((job_dir / "summaries" / "train").iterdir())
    assert any((job_dir / "summaries" / "eval_test").iterdir())

    config = serialization.load_json((job_dir / "config.json").read_text())
    assert fdl.build(config).task.train.num_train_steps == 60
    text = (job_dir / "config.txt").read_text()
    assert "task.model.vocab_size = 32" in text
    assert "# plugin testplugin: pax-testplugin 0.1.0" in text
    run = json.loads((job_dir / "runs.jsonl").read_text())
    assert run["experiment"] == "testplugin/TinyCounting"
    assert run["plugins"]["testplugin"] == "pax-testplugin 0.1.0"
    assert {"jax", "flax", "optax", "orbax-checkpoint"} <= set(run["versions"])

    second = run_pax("train", "--plugin", "testplugin", "--exp", "TinyCounting",
                     "--job-dir", str(job_dir), "--set", "NUM_TRAIN_STEPS=80")
    assert second.returncode == 0, second.stderr
    assert "resuming from step 60 of 80" in second.stdout
    steps = [r["step"] for r in read_metrics(job_dir) if r["kind"] == "train"]
    assert steps[-2:] == [70, 80]
    assert sorted(p.name for p in (job_dir / "checkpoints").iterdir()) == ["60", "80"]


def test_usage_mistake_is_one_line_and_exit_2(tmp_path):
    result = run_pax("train", "--exp", "TinyCountng", "--job-dir", str(tmp_path / "job"))
    assert result.returncode == 2
    assert result.stderr.strip() == ("pax: error: unknown experiment 'TinyCountng'; "
                                     "closest: TinyCounting")
    assert not (tmp_path / "job").exists()
    missing = run_pax("train", "--exp", "TinyCounting")
    assert missing.returncode == 2
    assert "--job-dir" in missing.stderr


def test_plugin_subcommand_is_listed_and_runs():
    assert "counting-sample" in run_pax("--help").stdout
    result = run_pax("counting-sample", "--rows", "2", "--seed", "3")
    assert result.returncode == 0, result.stderr
    rows = [[int(t) for t in line.split()] for line in result.stdout.splitlines()]
    assert len(rows) == 2
    for row in rows:
        strides = {(b - a) % 32 for a, b in itertools.pairwise(row)}
        assert len(strides) == 1 and strides <= {1, 2, 3}
    assert run_pax("counting-sample", "--rowz", "2").returncode == 2
