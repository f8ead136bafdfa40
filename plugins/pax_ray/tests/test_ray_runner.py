"""pax sweep --runner ray against a Ray cluster started here (ray start --head on 127.0.0.1):
trials run as Ray actors on its node, stop and resume, and a trial the cluster cannot hold is
refused."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pax_core.testing import cpu_xla_flags, read_metrics, run_pax, stop_once_saved

RAY = str(Path(sys.executable).with_name("ray"))
SWEEP = ["sweep", "--exp", "MlpSynthetic", "--runner", "ray", "--metric", "eval/test loss",
         "--search", "HIDDEN_DIMS=oneof([(32,)])"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A one-node Ray cluster with 2 CPUs; its workers see 2 fake CPU devices each."""
    address = f"127.0.0.1:{_free_port()}"
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": cpu_xla_flags(2),
           "PAX_CACHE_DIR": str(tmp_path_factory.mktemp("cache"))}
    subprocess.run([RAY, "start", "--head", f"--port={address.split(':')[1]}",
                    "--node-ip-address=127.0.0.1", "--num-cpus=2", "--num-gpus=0",
                    "--include-dashboard=false", "--disable-usage-stats"],
                   check=True, env=env, capture_output=True, timeout=120)
    # The sweep passes its own XLA_* and JAX_* on to the trials: here it has none, so the
    # trials see the cluster's.
    saved = {k: os.environ.pop(k) for k in ("XLA_FLAGS", "JAX_PLATFORMS") if k in os.environ}
    os.environ["RAY_ADDRESS"] = address
    try:
        yield address
    finally:
        del os.environ["RAY_ADDRESS"]
        os.environ.update(saved)
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)


def test_trials_run_as_ray_actors_on_the_cluster(cluster, tmp_path):
    sweep_dir = tmp_path / "s"
    result = run_pax(*SWEEP, "--sweep-dir", str(sweep_dir), "--algorithm", "grid", "--search",
                     "LEARNING_RATE=oneof([1e-3, 1e-2])", "--parallel", "2", "--set",
                     "NUM_TRAIN_STEPS=40", timeout=300)
    assert result.returncode == 0, result.stderr
    with open(sweep_dir / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["LEARNING_RATE"], r["status"]) for r in rows] == [
        ("0.01", "completed"), ("0.001", "completed")]
    for trial in ("000", "001"):
        log = (sweep_dir / "trials" / trial / "output.log").read_text()
        assert log.startswith("pax-ray: trial on "), log
        start = json.loads((sweep_dir / "trials" / trial / "metrics.jsonl").read_text()
                           .splitlines()[0])
        assert start["num_devices"] == 2  # the cluster's environment, not the sweep's


def test_a_stopped_ray_sweep_resumes_its_trial(cluster, tmp_path):
    sweep_dir = tmp_path / "s"
    command = [str(Path(sys.executable).with_name("pax")), *SWEEP, "--sweep-dir",
               str(sweep_dir), "--search", "LEARNING_RATE=oneof([0.01])", "--set",
               "NUM_TRAIN_STEPS=1000", "--set", "task.train.save_interval_steps=100", "--set",
               "task.train.eval_interval_steps=1000"]
    trial = sweep_dir / "trials" / "000"
    first = stop_once_saved(command, trial, signal.SIGINT)
    assert first.returncode == 130, first.stderr

    again = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    starts = [r["step"] for r in read_metrics(trial) if r["kind"] == "start"]
    assert starts[0] == 0 and starts[1] >= 100


def test_a_trial_the_cluster_cannot_hold_is_refused(cluster, tmp_path):
    result = run_pax(*SWEEP, "--sweep-dir", str(tmp_path / "s"), "--search",
                     "LEARNING_RATE=oneof([0.01])", "--set", "ICI_MESH_SHAPE=[1,4,1]",
                     "--platform", "gpu", timeout=120)
    assert result.returncode == 2, result.stderr
    assert ("a trial needs CPU 1, GPU 4 on one node, and the Ray cluster's nodes have at most "
            "CPU 2, GPU 0") in result.stderr
