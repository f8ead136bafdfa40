"""The wandb logger against W&B itself, offline (WANDB_MODE=offline: no network). A job's
metrics, steps and settings arrive in its W&B run, read back from the run's files with W&B's own
reader (``wandb leet inspect``); a resumed job continues the run; a run ends as the training
did (``finish``: finished, failed, or preempted when stopped on request), and finished when a
logger is closed without being told; W&B's variables choose what they name; and a W&B server
that cannot be reached costs a warning, not the run."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pax_core.testing import read_metrics, run_pax, stop_once_saved
from pax_wandb.loggers import WandbLogger

WANDB = str(Path(sys.executable).with_name("wandb"))
PAX = str(Path(sys.executable).with_name("pax"))
TRAIN = ["train", "--exp", "MlpSynthetic", "--set", "SUMMARY_INTERVAL_STEPS=2", "--set",
         "CHECKPOINT_EVERY_N_STEPS=3", "--set", "LOGGERS=('jsonl','wandb')"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """W&B offline, none of the machine's W&B settings, and a working directory of the tests'
    own, where nothing may land."""
    patch = pytest.MonkeyPatch()
    for name in [n for n in os.environ if n.startswith("WANDB_")]:
        patch.delenv(name)
    patch.setenv("WANDB_MODE", "offline")
    cwd = tmp_path_factory.mktemp("cwd")
    patch.chdir(cwd)
    yield cwd
    patch.undo()


@pytest.fixture(scope="module")
def reader_dir(tmp_path_factory) -> Path:
    """Where ``wandb leet`` runs (it writes a log of its own in its working directory)."""
    return tmp_path_factory.mktemp("reader")


def _inspect(run_dir: Path, where: Path, *flags: str) -> str:
    result = subprocess.run([WANDB, "leet", "inspect", "--json", *flags, str(run_dir)],
                            capture_output=True, text=True, timeout=120, cwd=where)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _records(run_dir: Path, where: Path) -> list[dict]:
    return [json.loads(line) for line in _inspect(run_dir, where).splitlines()]


def _summary(run_dir: Path, where: Path) -> dict:
    return json.loads(_inspect(run_dir, where, "--summary"))


def _history(records: list[dict]) -> dict[int, dict]:
    """``{step: row}`` of a run's history records."""
    rows = [r["history"]["item"] for r in records if r["type"] == "history"]
    return {row["_step"]: row for row in rows}


def _runs(job_dir: Path) -> list[Path]:
    """The job's W&B run folders, oldest first (their names start with the time)."""
    return sorted((job_dir / "wandb").glob("offline-run-*"))


@pytest.fixture(scope="module")
def job(workdir, tmp_path_factory) -> Path:
    """A job of 6 steps, summaries every 2, logged to W&B."""
    job_dir = tmp_path_factory.mktemp("jobs") / "tiny-mlp"
    result = run_pax(*TRAIN, "--job-dir", str(job_dir), "--set", "NUM_TRAIN_STEPS=6",
                     timeout=300)
    assert result.returncode == 0, result.stderr
    return job_dir


def test_a_job_is_a_wandb_run_with_its_metrics_at_their_steps(job, workdir, reader_dir):
    [run_dir] = _runs(job)
    run_id = json.loads((job / "wandb_run.json").read_text())["id"]
    summary = _summary(run_dir, reader_dir)
    assert (summary["run_id"], summary["name"], summary["project"]) == (run_id, "tiny-mlp", "pax")
    assert (summary["state"], summary["exit_code"]) == ("finished", 0)

    history = _history(_records(run_dir, reader_dir))
    logged = [r for r in read_metrics(job) if r["kind"] != "start"]
    assert sorted(history) == sorted({r["step"] for r in logged}) == [2, 4, 6]
    for record in logged:
        row = history[record["step"]]
        for name, value in record.items():
            if name not in ("step", "kind", "time") and value is not None:
                assert row[f"{record['kind']}/{name}"] == value, (record["step"], name)
    assert "eval/test/loss" in history[6] and "eval/test/loss" not in history[4]
    assert list(workdir.iterdir()) == []  # W&B's files are the job's


def test_the_runs_config_is_the_jobs_settings(job, reader_dir):
    [run_dir] = _runs(job)
    config = _summary(run_dir, reader_dir)["config"]
    [start] = [r for r in read_metrics(job) if r["kind"] == "start"]
    for name, value in start.items():  # the run's settings, as the loop gave them
        if name not in ("step", "kind", "time"):
            assert config[name] == value, name
    assert config["experiment"] == "core/MlpSynthetic"
    # The job's config tree, each setting by its path, typed; and the --set overrides.
    assert config["task.train.num_train_steps"] == 6
    assert config["task.train.learner.optimizer.learning_rate"] == 0.003
    assert config["task.model.hidden_dims"] == [64]
    assert config["datasets[1].name"] == "test"
    assert config["task.train.early_stopping"] is None
    assert "NUM_TRAIN_STEPS=6" in config["overrides"]


def test_a_resumed_job_continues_its_wandb_run(job, reader_dir):
    run_id = json.loads((job / "wandb_run.json").read_text())["id"]
    result = run_pax(*TRAIN, "--job-dir", str(job), "--set", "NUM_TRAIN_STEPS=10", timeout=300)
    assert result.returncode == 0, result.stderr

    _, second = _runs(job)
    records = _records(second, reader_dir)
    [run] = [r["run"] for r in records if r["type"] == "run"]
    assert (run["run_id"], run["resume"]) == (run_id, True)
    assert json.loads((job / "wandb_run.json").read_text())["id"] == run_id
    assert sorted(_history(records)) == [8, 10]  # the steps after the checkpoint at 6
    summary = _summary(second, reader_dir)
    assert summary["config"]["task.train.num_train_steps"] == 10  # the settings it trained with
    assert summary["state"] == "finished"


def test_a_run_stopped_on_request_is_preempted(workdir, tmp_path, reader_dir):
    job_dir = tmp_path / "stopped"
    command = [PAX, *TRAIN, "--job-dir", str(job_dir), "--set", "NUM_TRAIN_STEPS=100000",
               "--set", "CHECKPOINT_EVERY_N_STEPS=50"]
    result = stop_once_saved(command, job_dir, signal.SIGTERM)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr

    [run_dir] = _runs(job_dir)
    records = _records(run_dir, reader_dir)
    assert [r for r in records if r["type"] == "preempting"]
    assert [r["exit"]["exit_code"] for r in records if r["type"] == "exit"] == [0]
    assert max(_history(records)) >= 50  # it logged up to its stop


def test_wandbs_variables_choose_the_project_name_folder_and_id(workdir, tmp_path,
                                                                monkeypatch, reader_dir):
    monkeypatch.setenv("WANDB_PROJECT", "their-project")
    monkeypatch.setenv("WANDB_NAME", "their-name")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "files"))
    monkeypatch.setenv("WANDB_RUN_ID", "theirid1")
    (tmp_path / "files").mkdir()
    job_dir = tmp_path / "job"
    result = run_pax(*TRAIN, "--job-dir", str(job_dir), "--set", "NUM_TRAIN_STEPS=2",
                     timeout=300)
    assert result.returncode == 0, result.stderr

    assert not (job_dir / "wandb").exists()
    [run_dir] = sorted((tmp_path / "files" / "wandb").glob("offline-run-*"))
    summary = _summary(run_dir, reader_dir)
    assert (summary["project"], summary["name"], summary["run_id"]) == (
        "their-project", "their-name", "theirid1")
    assert json.loads((job_dir / "wandb_run.json").read_text()) == {"id": "theirid1"}


def test_a_job_keeps_its_run_whatever_wandb_run_id_says(workdir, tmp_path, monkeypatch,
                                                         capsys, reader_dir):
    (tmp_path / "wandb_run.json").write_text('{"id": "jobsrun1"}')
    monkeypatch.setenv("WANDB_RUN_ID", "another1")
    logger = WandbLogger(str(tmp_path))
    logger.start(experiment="core/MlpSynthetic", start_step=4, num_train_steps=6, hparams={})
    logger.write(6, "train", {"loss": 0.5})
    logger.finish("failed")
    logger.close()  # the run has ended: closing leaves it failed

    assert "WANDB_RUN_ID=another1 is not this job's W&B run" in capsys.readouterr().err
    [run_dir] = _runs(tmp_path)
    summary = _summary(run_dir, reader_dir)
    assert (summary["run_id"], summary["state"], summary["exit_code"]) == ("jobsrun1", "failed", 1)
    assert summary["summary"]["train/loss"] == 0.5


def test_a_logger_closed_without_finish_ends_its_run_finished(workdir, tmp_path, reader_dir):
    unstarted = WandbLogger(str(tmp_path / "unstarted"))
    unstarted.finish("failed")  # a loop that failed before start: no run to end
    unstarted.close()
    (tmp_path / "job").mkdir()
    logger = WandbLogger(str(tmp_path / "job"))
    logger.start(experiment="core/MlpSynthetic", start_step=0, num_train_steps=2, hparams={})
    logger.write(2, "train", {"loss": 0.25})
    logger.close()

    [run_dir] = _runs(tmp_path / "job")
    summary = _summary(run_dir, reader_dir)
    assert (summary["state"], summary["exit_code"]) == ("finished", 0)
    assert summary["summary"]["train/loss"] == 0.25


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_wandb_server_out_of_reach_is_a_warning_and_the_run_goes_on(workdir, tmp_path,
                                                                      monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{_closed_port()}")
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "5")
    job_dir = tmp_path / "job"
    result = run_pax(*TRAIN, "--job-dir", str(job_dir), "--set", "NUM_TRAIN_STEPS=4",
                     timeout=300)
    assert result.returncode == 0, result.stderr
    assert "pax: warning: logger WandbLogger failed in start" in result.stderr
    assert [r["step"] for r in read_metrics(job_dir) if r["kind"] == "train"] == [2, 4]
