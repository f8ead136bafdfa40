"""The mlflow logger against MLflow's tracking server, started here on 127.0.0.1 (a SQLite store)
and read back through MlflowClient. A job's metrics, steps and settings arrive in its run; a
resumed job continues the run; a run ends as the training did (``finish``: FINISHED, FAILED, or
KILLED when stopped on request), and FINISHED when a logger is closed without being told;
settings longer than MLflow takes are cut; a missing tracking URI is refused; and a server that
stalls or is gone never holds the training up, and costs the end of a run a bounded wait."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from pax_core.testing import read_metrics, run_pax, stop_once_saved
from pax_mlflow import loggers, sender
from pax_mlflow.loggers import MlflowLogger

MLFLOW = str(Path(sys.executable).with_name("mlflow"))
PAX = str(Path(sys.executable).with_name("pax"))
TRAIN = ["train", "--exp", "MlpSynthetic", "--set", "SUMMARY_INTERVAL_STEPS=2", "--set",
         "CHECKPOINT_EVERY_N_STEPS=3", "--set", "LOGGERS=('jsonl','mlflow')"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """``mlflow server`` on 127.0.0.1 (its process group, so that it can be paused whole), and
    the tests' environment pointed at it alone; stopped at the end."""
    root = tmp_path_factory.mktemp("mlflow")
    uri = f"http://127.0.0.1:{_free_port()}"
    with open(root / "server.log", "w") as log:
        process = subprocess.Popen(
            [MLFLOW, "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
             "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1",
             "--port", uri.rsplit(":", 1)[1], "--workers", "1"],
            stdout=log, stderr=subprocess.STDOUT, cwd=root, start_new_session=True)
    patch = pytest.MonkeyPatch()
    try:
        deadline = time.monotonic() + 240
        while not _healthy(uri):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"mlflow server did not start:\n{(root / 'server.log').read_text()}")
            time.sleep(0.25)
        for name in [n for n in os.environ if n.startswith("MLFLOW_")]:
            patch.delenv(name)
        patch.setenv("MLFLOW_TRACKING_URI", uri)
        yield process
    finally:
        patch.undo()
        os.killpg(process.pid, signal.SIGCONT)  # a test that paused it may have failed
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _healthy(uri: str) -> bool:
    try:
        with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
            return answer.read() == b"OK"
    except OSError:
        return False


@pytest.fixture
def client(server) -> MlflowClient:
    return MlflowClient(os.environ["MLFLOW_TRACKING_URI"])


def _run_id(job_dir: Path) -> str:
    return json.loads((job_dir / "mlflow_run.json").read_text())["run_id"]


def _history(client: MlflowClient, run_id: str, name: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, name))


@pytest.fixture(scope="module")
def job(server, tmp_path_factory) -> Path:
    """A job of 6 steps, summaries every 2, logged to MLflow."""
    job_dir = tmp_path_factory.mktemp("jobs") / "tiny-mlp"
    result = run_pax(*TRAIN, "--job-dir", str(job_dir), "--set", "NUM_TRAIN_STEPS=6",
                     timeout=300)
    assert result.returncode == 0, result.stderr
    return job_dir


def test_a_job_is_an_mlflow_run_with_its_metrics_at_their_steps(job, client):
    run = client.get_run(_run_id(job))
    assert (run.info.status, run.info.run_name) == ("FINISHED", "tiny-mlp")
    assert client.get_experiment(run.info.experiment_id).name == "core/MlpSynthetic"
    assert run.data.tags["pax.job_dir"] == str(job)

    logged = [r for r in read_metrics(job) if r["kind"] != "start"]
    assert [r["step"] for r in logged if r["kind"] == "train"] == [2, 4, 6]
    names = {f"{r['kind']}/{n}" for r in logged for n in r if n not in ("step", "kind", "time")}
    assert set(run.data.metrics) == names
    for name in names:
        kind, _, metric = name.rpartition("/")
        expected = [(r["step"], r[metric]) for r in logged
                    if r["kind"] == kind and r.get(metric) is not None]
        assert _history(client, run.info.run_id, name) == expected, name


def test_the_runs_params_are_the_jobs_settings(job, client):
    params = client.get_run(_run_id(job)).data.params
    [start] = [r for r in read_metrics(job) if r["kind"] == "start"]
    for name, value in start.items():  # the run's settings, as the loop gave them
        if name not in ("step", "kind", "time"):
            assert params[name] == str(value), name
    # The job's config tree, each setting by its path (indices as parts); the overrides.
    assert params["task.train.num_train_steps"] == "6"
    assert params["task.train.learner.optimizer.learning_rate"] == "0.003"
    assert params["task.model.hidden_dims"] == "(64,)"
    assert params["datasets.1.name"] == "test"
    assert "NUM_TRAIN_STEPS=6" in params["overrides"].split("; ")


def test_a_resumed_job_continues_its_mlflow_run(job, client):
    run_id = _run_id(job)
    result = run_pax(*TRAIN, "--job-dir", str(job), "--set", "NUM_TRAIN_STEPS=10", timeout=300)
    assert result.returncode == 0, result.stderr

    assert _run_id(job) == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    losses = {r["step"]: r["loss"] for r in read_metrics(job) if r["kind"] == "train"}
    assert _history(client, run_id, "train/loss") == sorted(losses.items())
    assert [s for s, _ in _history(client, run_id, "eval/test/loss")] == [6, 10]
    assert run.data.params["task.train.num_train_steps"] == "6"  # MLflow's params stay


def test_a_run_stopped_on_request_is_killed(server, client, tmp_path):
    job_dir = tmp_path / "stopped"
    command = [PAX, *TRAIN, "--job-dir", str(job_dir), "--set", "NUM_TRAIN_STEPS=100000",
               "--set", "CHECKPOINT_EVERY_N_STEPS=50"]
    result = stop_once_saved(command, job_dir, signal.SIGTERM)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr

    run = client.get_run(_run_id(job_dir))
    assert run.info.status == "KILLED"
    last = max(r["step"] for r in read_metrics(job_dir) if r["kind"] == "train")
    assert _history(client, run.info.run_id, "train/loss")[-1][0] == last >= 50


def test_mlflows_experiment_variable_names_the_experiment(server, client, tmp_path,
                                                          monkeypatch):
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "their-experiment")
    logger = MlflowLogger(str(tmp_path))
    logger.start(experiment="core/MlpSynthetic", start_step=0, num_train_steps=1, hparams={})
    logger.finish("failed")
    logger.close()  # the run has ended: closing leaves it FAILED

    run = client.get_run(_run_id(tmp_path))
    assert client.get_experiment(run.info.experiment_id).name == "their-experiment"
    assert run.info.status == "FAILED"


def test_settings_longer_than_mlflow_takes_are_cut(server, client, tmp_path):
    logger = MlflowLogger(str(tmp_path))
    logger.start(experiment="core/MlpSynthetic", start_step=0, num_train_steps=1,
                 hparams={"note": "n" * 7000, "short": 1.5})
    logger.text(0, "config", "# experiment: core/MlpSynthetic\n"
                             f"task.name = '{'t' * 7000}'\ndatasets[0].name = 'train'\n")
    logger.write(1, "train", {"loss": 0.25})
    logger.finish("completed")
    logger.close()

    run = client.get_run(_run_id(tmp_path))
    params = run.data.params
    assert params["note"] == "n" * 5997 + "..."
    assert params["task.name"] == "t" * 5997 + "..."
    assert (params["short"], params["datasets.0.name"]) == ("1.5", "train")
    assert "overrides" not in params  # none given
    assert _history(client, run.info.run_id, "train/loss") == [(1, 0.25)]
    assert run.info.status == "FINISHED"


def test_a_logger_closed_without_finish_ends_its_run_finished(server, client, tmp_path):
    unstarted = MlflowLogger(str(tmp_path / "unstarted"))
    unstarted.finish("failed")  # a loop that failed before start: no run to end
    unstarted.close()
    (tmp_path / "job").mkdir()
    logger = MlflowLogger(str(tmp_path / "job"))
    logger.start(experiment="core/MlpSynthetic", start_step=0, num_train_steps=2, hparams={})
    logger.write(2, "train", {"loss": 0.25})
    logger.close()

    run = client.get_run(_run_id(tmp_path / "job"))
    assert run.info.status == "FINISHED"
    assert _history(client, run.info.run_id, "train/loss") == [(2, 0.25)]


def test_without_a_tracking_uri_the_run_stops_naming_it(server, tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    result = run_pax(*TRAIN, "--job-dir", str(tmp_path / "job"), "--set", "NUM_TRAIN_STEPS=2")
    assert result.returncode == 2  # a usage mistake
    [line] = [e for e in result.stderr.splitlines() if e.startswith("pax: error:")]
    assert "set MLFLOW_TRACKING_URI" in line
    assert not list((tmp_path / "job").glob("checkpoints/*"))  # before any training


def _stderr_until(capsys, text: str, timeout: float) -> str:
    """What was printed on stderr, once it holds ``text`` (the logger's thread prints)."""
    seen, deadline = "", time.monotonic() + timeout
    while text not in seen:
        assert time.monotonic() < deadline, f"no {text!r} on stderr in {timeout} s:\n{seen}"
        time.sleep(0.1)
        seen += capsys.readouterr().err
    return seen


def test_a_stalled_server_holds_nothing_up_and_gets_everything_after(server, client, tmp_path,
                                                                     monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    logger = MlflowLogger(str(tmp_path))
    logger.start(experiment="core/MlpSynthetic", start_step=0, num_train_steps=6, hparams={})
    logger.write(1, "train", {"loss": 1.0})
    os.killpg(server.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        for step in range(2, 6):
            logger.write(step, "train", {"loss": 1.0 / step})
        assert time.monotonic() - started < 0.5  # the loop's calls never wait on the server
        _stderr_until(capsys, "pax: warning: MLflow at http://127.0.0.1", timeout=60)
    finally:
        os.killpg(server.pid, signal.SIGCONT)
    logger.write(6, "train", {"loss": 1.0 / 6})
    logger.finish("completed")
    logger.close()
    assert "answers again" in capsys.readouterr().err

    run = client.get_run(_run_id(tmp_path))
    assert run.info.status == "FINISHED"
    assert _history(client, run.info.run_id, "train/loss") == [
        (1, 1.0), *((s, 1.0 / s) for s in range(2, 7))]


def test_a_server_gone_for_good_costs_the_end_of_the_run_a_bounded_wait(tmp_path, monkeypatch,
                                                                        capsys):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_free_port()}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setattr(loggers, "FLUSH_TIMEOUT_SEC", 2.0)
    logger = MlflowLogger(str(tmp_path))
    logger.start(experiment="core/MlpSynthetic", start_step=0, num_train_steps=2, hparams={})
    logger.write(1, "train", {"loss": 1.0})
    logger.write(2, "train", {"loss": 0.5, "accuracy": 0.75})
    started = time.monotonic()
    logger.finish("completed")
    logger.close()
    assert time.monotonic() - started < 5
    err = capsys.readouterr().err
    assert err.count("pax: warning: MLflow at") == 2  # failed (once), and what is left out
    assert "has not taken the last 3 metric values within 2 s" in err
    assert not (tmp_path / "mlflow_run.json").exists()


def test_a_server_stalled_at_the_end_leaves_the_run_running_saying_what_is_left_out(
        server, client, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setattr(loggers, "FLUSH_TIMEOUT_SEC", 2.0)
    monkeypatch.setattr(sender, "RETRY_MAX_SEC", 0.5)  # a thread still trying would try soon
    logger = MlflowLogger(str(tmp_path))
    logger.start(experiment="core/MlpSynthetic", start_step=0, num_train_steps=2, hparams={})
    deadline = time.monotonic() + 60
    while not (tmp_path / "mlflow_run.json").exists():  # the run is made
        assert time.monotonic() < deadline
        time.sleep(0.1)
    run_id = _run_id(tmp_path)
    os.killpg(server.pid, signal.SIGSTOP)
    try:
        logger.write(1, "train", {"loss": 1.0})
        started = time.monotonic()
        logger.finish("completed")
        assert time.monotonic() - started < 4
        time.sleep(1.5)  # the request the logger's thread was in has timed out: it is done
    finally:
        os.killpg(server.pid, signal.SIGCONT)
    logger.close()
    time.sleep(2)  # what a thread that had not given up would have sent by now

    assert (f"has not taken the last 1 metric values within 2 s: they are left out "
            f"(metrics.jsonl has every value); run {run_id} stays RUNNING"
            ) in capsys.readouterr().err
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_TIMEOUT")  # the server has a backlog to answer first
    assert client.get_run(run_id).info.status == "RUNNING"
