"""Pax's command line runs as it is: its flags translated, its modes as subcommands, a chosen
checkpoint step restored, a config file trained, notices for the flags that no longer apply."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pax_core.cli.pax_flags import translate
from pax_core.errors import UsageError
from pax_core.testing import read_metrics, run_pax, train_losses

TRANSLATED = [
    (["--exp=tasks.lm.X", "--job_log_dir=/d"], ["train", "--exp", "tasks.lm.X", "--job-dir", "/d"]),
    (["--exp", "X", "--job_log_dir", "/d", "--mode", "eval"],
     ["eval", "--exp", "X", "--job-dir", "/d"]),
    (["--plugins=lm", "--fdl_config=X", "--job_log_dir=/d", "--mode=decode_once",
      "--restore_checkpoint_step=20"],
     ["--plugins=lm", "decode", "--exp", "X", "--job-dir", "/d", "--restore-checkpoint-step",
      "20"]),
    (["--exp=X", "--job_log_dir=/d", "--eval_on_test"],
     ["train", "--exp", "X", "--job-dir", "/d", "--eval-on-test"]),
    (["--exp=X", "--job_log_dir=/d", "--noeval_on_test"],
     ["train", "--exp", "X", "--job-dir", "/d", "--no-eval-on-test"]),
    (["--exp=X", "--job_log_dir=/d", "--eval_on_test=false"],
     ["train", "--exp", "X", "--job-dir", "/d", "--no-eval-on-test"]),
    (["--exp=X", "--job_log_dir=/d", "--fdl_config_file=c.json", "--fdl.NUM_LAYERS=4"],
     ["train", "--exp", "X", "--job-dir", "/d", "--fdl-config-file", "c.json", "--set",
      "NUM_LAYERS=4"]),
    (["--exp=X", "--job_log_dir=/d", "--server_addr=h:1234", "--num_hosts=2", "--host_idx=1"],
     ["train", "--exp", "X", "--job-dir", "/d", "--coordinator-address", "h:1234",
      "--num-processes", "2", "--process-id", "1"]),
    (["train", "--exp", "X", "--job-dir", "d"], ["train", "--exp", "X", "--job-dir", "d"]),
    (["launch", "-n", "2", "--", "pax", "train", "--job_log_dir=/d"],
     ["launch", "-n", "2", "--", "pax", "train", "--job_log_dir=/d"]),
]


@pytest.mark.parametrize("argv, expected", TRANSLATED)
def test_pax_flags_become_pax_options(argv, expected):
    assert translate(argv) == expected


def test_flags_that_no_longer_apply_are_named_once_and_dropped(capsys):
    argv = ["--exp=X", "--job_log_dir=/d", "--jax_fully_async_checkpoint",
            "--nomaybe_use_persistence_checkpointing", "--alsologtostderr"]
    assert translate(argv) == ["train", "--exp", "X", "--job-dir", "/d"]
    notices = capsys.readouterr().err.splitlines()
    assert [n.split(" is a Pax flag")[0] for n in notices] == [
        "pax: warning: --jax_fully_async_checkpoint",
        "pax: warning: --maybe_use_persistence_checkpointing", "pax: warning: --alsologtostderr"]
    assert all(n.endswith("; ignored") for n in notices)


@pytest.mark.parametrize("argv, message", [
    (["--exp=X", "--job_log_dir=/d", "--mode=infer"], "--mode=infer has no counterpart here"),
    (["--exp=X", "--job_log_dir=/d", "--study=s"], "--study belongs to Pax's tuning"),
    (["--exp=X", "--job_log_dir=/d", "--eval_on_test=maybe"], "expected true or false"),
    (["train", "--exp=X", "--mode=eval"], "--mode=eval contradicts the subcommand train"),
    (["--exp=X", "--job_log_dir"], "--job_log_dir needs a value"),
])
def test_a_pax_flag_that_cannot_be_read_is_a_usage_error(argv, message):
    with pytest.raises(UsageError, match=message):
        translate(argv)


STEPS = ["--fdl.task.train.save_interval_steps=2", "--fdl.task.train.save_max_to_keep=5",
         "--fdl.task.train.summary_interval_steps=1"]


@pytest.fixture(scope="module")
def pax_job(tmp_path_factory) -> Path:
    """MlpSynthetic trained for 6 steps by a Pax command line."""
    job = tmp_path_factory.mktemp("pax") / "job"
    result = run_pax("--exp=MlpSynthetic", f"--job_log_dir={job}", "--mode=train",
                     "--fdl.NUM_TRAIN_STEPS=6", *STEPS, "--jax_fully_async_checkpoint")
    assert result.returncode == 0, result.stderr
    assert "--jax_fully_async_checkpoint is a Pax flag" in result.stderr
    return job


@pytest.mark.slow
def test_a_pax_command_line_trains_and_evaluates_a_chosen_step(pax_job):
    assert sorted(int(p.name) for p in (pax_job / "checkpoints").iterdir()) == [2, 4, 6]
    latest = run_pax("--mode=eval", "--exp=MlpSynthetic", f"--job_log_dir={pax_job}", "--json")
    chosen = run_pax("--mode=eval", "--exp=MlpSynthetic", f"--job_log_dir={pax_job}", "--json",
                     "--restore_checkpoint_step=2")
    assert latest.returncode == chosen.returncode == 0, latest.stderr + chosen.stderr
    assert json.loads(latest.stdout)["step"] == 6 and json.loads(chosen.stdout)["step"] == 2
    assert json.loads(latest.stdout)["eval"] != json.loads(chosen.stdout)["eval"]


@pytest.mark.slow
def test_a_missing_step_is_refused_naming_those_there_are(pax_job):
    runs = (pax_job / "runs.jsonl").read_text()
    result = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(pax_job),
                     "--restore-checkpoint-step", "3", "--set", "NUM_TRAIN_STEPS=6")
    assert result.returncode == 2
    assert "no checkpoint at step 3 in " in result.stderr
    assert "(its steps: 2, 4, 6)" in result.stderr
    assert (pax_job / "runs.jsonl").read_text() == runs


@pytest.mark.slow
def test_training_restarts_from_a_chosen_step_and_sets_the_later_ones_aside(pax_job, tmp_path):
    job = tmp_path / "job"
    shutil.copytree(pax_job, job)
    before = train_losses(job)
    result = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(job), "--set",
                     "NUM_TRAIN_STEPS=6", *[f"--set={s[len('--fdl.'):]}" for s in STEPS],
                     "--restore-checkpoint-step", "2")
    assert result.returncode == 0, result.stderr
    assert "restarting from step 2: moved the later checkpoints (steps 4, 6) to " in result.stderr
    assert "resuming from step 2 of 6" in result.stdout
    assert sorted(p.name.split("-")[0] for p in (job / "rolled_back_checkpoints").iterdir()) == [
        "4", "6"]
    assert train_losses(job) == before  # the same steps again, the same numbers


@pytest.mark.slow
def test_no_eval_on_test_trains_without_evaluating(tmp_path):
    result = run_pax("--exp=MlpSynthetic", f"--job_log_dir={tmp_path}", "--noeval_on_test",
                     "--fdl.NUM_TRAIN_STEPS=4")
    assert result.returncode == 0, result.stderr
    assert not [r for r in read_metrics(tmp_path) if r["kind"].startswith("eval/")]


@pytest.mark.slow
def test_a_config_file_trains_the_same_run_and_eval_reads_it_back(pax_job, tmp_path):
    job = tmp_path / "job"
    result = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(job),
                     "--fdl-config-file", str(pax_job / "config.json"))
    assert result.returncode == 0, result.stderr
    assert (job / "config.json").read_text() == (pax_job / "config.json").read_text()
    assert train_losses(job) == train_losses(pax_job)
    assert json.loads((job / "runs.jsonl").read_text())["config_file"] == str(
        pax_job / "config.json")
    evaluated = run_pax("eval", "--job-dir", str(job), "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    (job / "config.json").write_text('{"truncated": ')
    damaged = run_pax("eval", "--job-dir", str(job))
    assert damaged.returncode == 2
    assert f"config file {job / 'config.json'} is not a Fiddle config" in damaged.stderr


@pytest.mark.slow
@pytest.mark.parametrize("content, message", [
    ("not json", "is not a Fiddle config written by pax train"),
    (None, "cannot be read"),
])
def test_a_config_file_that_does_not_read_is_one_line(tmp_path, content, message):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    result = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(tmp_path / "job"),
                     "--fdl-config-file", str(path))
    assert result.returncode == 2
    assert f"pax: error: config file {path} {message}" in result.stderr
    assert not (tmp_path / "job").exists()
