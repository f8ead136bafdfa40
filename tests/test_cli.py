"""`pax train` end to end through the installed command, as a user runs it."""

from __future__ import annotations

import itertools
import json
import re

import fiddle as fdl
from fiddle.experimental import serialization

from pax_core.loggers.console import format_value
from pax_core.testing import read_metrics, run_pax


def train_loss(job_dir) -> float:
    return [r for r in read_metrics(job_dir) if r["kind"] == "train"][-1]["loss"]


def test_train_learns_checkpoints_and_resumes(tmp_path):
    job_dir = tmp_path / "job"
    first = run_pax("train", "--plugin", "testplugin", "--exp", "TinyCounting",
                    "--job-dir", str(job_dir))
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    # Something to read while the first program compiles, then the start, then the steps.
    assert lines[:2] == ["testplugin/TinyCounting: compiling the train step",
                         "testplugin/TinyCounting: starting at step 0 of 60"]
    assert re.fullmatch(r"step 40/60 loss=\S+ eval/test/loss=\S+ steps_per_sec=\S+ "
                        r"elapsed=\d+:\d\d:\d\d eta=\d+:\d\d:\d\d",
                        next(line for line in lines if line.startswith("step 40/60 ")))
    # The run ends with a summary: where it got to, its last results and where to look.
    summary = lines[lines.index(next(line for line in lines if "trained to step 60 of 60"
                                     in line)):]
    last = read_metrics(job_dir)[-1]
    assert summary[1:] == [
        f"  train loss={format_value(train_loss(job_dir))}",
        "  eval/test " + " ".join(f"{k}={format_value(v)}" for k, v in last.items()
                                  if k not in ("step", "kind", "time")),
        f"  checkpoint: {job_dir / 'checkpoints' / '60'}",
        f"  see the run: tensorboard --logdir {job_dir}/summaries, or pax plot {job_dir} "
        f"--output loss.png"]

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

    events = sorted((job_dir / "summaries" / "train").iterdir())
    # Resumed with the loggers chosen on the command line: TensorBoard's left out.
    second = run_pax("train", "--plugin", "testplugin", "--exp", "TinyCounting",
                     "--job-dir", str(job_dir), "--set", "NUM_TRAIN_STEPS=80",
                     "--loggers", "console,jsonl")
    assert second.returncode == 0, second.stderr
    assert sorted((job_dir / "summaries" / "train").iterdir()) == events
    assert second.stdout.splitlines()[-1] == f"  see the run: pax plot {job_dir} --output loss.png"
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
    unknown = run_pax("train", "--exp", "TinyCounting", "--loggers", "console,wandbb",
                      "--job-dir", str(tmp_path / "job"))
    assert unknown.returncode == 2 and "wandbb" in unknown.stderr, unknown.stderr
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
