"""A gs:// job directory, against a GCS emulator the test starts on 127.0.0.1 (never the
network): checkpoints through Orbax and TensorStore, records, metrics and TensorBoard events
through epath, resume bitwise, damage found, unfinished saves removed, bad paths refused."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pax_core.errors import UsageError
from pax_core.files import job_path
from pax_core.testing import (
    assert_same_params,
    fault_trials,
    isolated_host,
    kill_trials,
    read_metrics,
    read_params,
    run_pax,
    train,
)

pytestmark = pytest.mark.slow

BUCKET = "pax-test"
RUN = ["--exp", "MlpSynthetic", "--set", "NUM_TRAIN_STEPS=40",
       "--set", "task.train.save_interval_steps=10", "--set", "task.train.summary_interval_steps=5"]
# Fewer steps of the same run (its learning-rate schedule still spans 40).
PART = ["--set", "task.train.num_train_steps={}"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(url: str, process: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the storage emulator exited with {process.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1):
            return
        time.sleep(0.05)
    raise TimeoutError(url)


@pytest.fixture(scope="module")
def gcs() -> Iterator[str]:
    """A GCS emulator (``gcs_emulator.py``: gcp-storage-emulator, in memory) with one bucket;
    every GCS client of this process and of the ``pax`` processes it starts is pointed at it."""
    port = _free_port()
    process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("gcs_emulator.py")),
                                "start", "--host", "127.0.0.1", "--port", str(port),
                                "--in-memory", "-q"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    saved = dict(os.environ)
    os.environ.update({
        "STORAGE_EMULATOR_HOST": base,  # gcsfs and google-cloud-storage (tensorboardX)
        "TENSORSTORE_GCS_HTTP_URL": base,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",  # TensorStore looks for no credentials
        "FSSPEC_GCS_TOKEN": "anon", "NO_GCE_CHECK": "true",
        "GOOGLE_CLOUD_PROJECT": "pax-test",
        # gcsfs would ask the emulator for the bucket's layout over gRPC, which it lacks.
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    })
    try:
        _wait(base + "/", process)
        request = urllib.request.Request(
            f"{base}/storage/v1/b?project=pax-test", data=json.dumps({"name": BUCKET}).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        urllib.request.urlopen(request).close()
        import fsspec

        fsspec.config.conf.setdefault("gcs", {})["token"] = "anon"  # this process's gcsfs
        yield f"gs://{BUCKET}"
    finally:
        os.environ.clear()
        os.environ.update(saved)
        process.terminate()
        process.wait(10)


def _objects(url: str) -> list[str]:
    root = job_path(url)
    found, todo = [], [root]
    while todo:
        for path in todo.pop().iterdir():
            (todo if path.is_dir() else found).append(path)
    return sorted(str(p.relative_to(root)) for p in found)


@pytest.fixture(scope="module")
def half_trained(gcs) -> str:
    """A gs:// job that trained RUN's first 20 steps, trained once for the tests that start
    from there; each works on a copy of its own (``_copy``)."""
    job = f"{gcs}/jobs/half"
    result = run_pax("train", *RUN, "--job-dir", job, PART[0], PART[1].format(20))
    assert result.returncode == 0, result.stderr
    return job


def _copy(source: str, target: str) -> str:
    """``source``'s objects, byte for byte, under ``target`` (a bucket has no folders)."""
    for name in _objects(source):
        job_path(f"{target}/{name}").write_bytes(job_path(f"{source}/{name}").read_bytes())
    return target


def test_a_gs_job_trains_resumes_bitwise_and_evaluates(gcs, half_trained, tmp_path):
    job = _copy(half_trained, f"{gcs}/jobs/mlp")
    # A save killed before its commit mark leaves a step without one: removed, with a line.
    job_path(f"{job}/checkpoints/35/state/partial").write_text("interrupted")
    rest = run_pax("train", *RUN, "--job-dir", job)
    assert rest.returncode == 0, rest.stderr
    assert "removed the unfinished save of step 35" in rest.stderr
    straight = run_pax("train", *RUN, "--job-dir", str(tmp_path / "local"))
    assert straight.returncode == 0, straight.stderr

    remote, local = read_params(job), read_params(tmp_path / "local")
    assert remote.keys() == local.keys()
    for name in remote:
        np.testing.assert_array_equal(remote[name], local[name])
    steps = [r["step"] for r in read_metrics(job) if r["kind"] == "train"]
    assert steps == sorted(set(steps)) and steps[-1] == 40  # no step recorded twice
    objects = _objects(job)
    for expected in ("config.json", "config.txt", "runs.jsonl", "checkpoints/40/commit_success.txt",
                     "checkpoints/40/pax_checksums.json"):
        assert expected in objects, objects
    assert any(o.startswith("summaries/train/events.out.tfevents") for o in objects), objects
    assert not any(o.startswith("checkpoints/35/") for o in objects)
    assert len(job_path(f"{job}/runs.jsonl").read_text().splitlines()) == 2
    assert not Path("gs:").exists() and not (tmp_path / "gs:").exists()

    evaluated = run_pax("eval", "--job-dir", job, "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["step"] == 40
    exported = run_pax("export", "--job-dir", job, "--output", str(tmp_path / "export"))
    assert exported.returncode == 0, exported.stderr
    assert json.loads((tmp_path / "export" / "export.json").read_text())["job_dir"] == job
    to_bucket = run_pax("export", "--job-dir", job, "--output", f"{gcs}/exports/mlp")
    assert to_bucket.returncode == 2 and "writes a local directory" in to_bucket.stderr


def test_a_gs_job_killed_at_random_moments_resumes_bitwise(gcs, tmp_path):
    trials = fault_trials(10, 20)
    # Enough steps to outlast the trials (a soak's 20 have reached step 28; 10 reach step 6).
    args = ["--exp", "MlpSynthetic", "--set", f"NUM_TRAIN_STEPS={fault_trials(16, 80)}",
            "--set", "task.train.save_interval_steps=1",
            "--set", "task.train.summary_interval_steps=1",
            "--set", "task.train.eval_interval_steps=1000"]
    # The run left alone first: the killed runs load the programs it compiled.
    cache = {"PAX_COMPILATION_CACHE": str(tmp_path / "xla")}
    straight = kill_trials(args, tmp_path / "straight", trials=0, env=cache)
    assert straight.finished.returncode == 0, straight.finished.stderr
    killed = kill_trials(args, f"{gcs}/jobs/killed", trials=trials, seed=3, env=cache)
    print(f"gs:// kill -9: {killed.killed} runs killed mid-run ({killed.redrawn} more ended "
          f"before their kill and were redrawn), resumed from {killed.resumed}, "
          f"{killed.unfinished_removed} unfinished saves removed, {len(killed.damaged)} damaged")
    assert killed.finished.returncode == 0, killed.finished.stderr
    assert killed.killed == trials  # killed mid-run, each of them
    assert killed.tracebacks == [], killed.tracebacks[0]
    assert killed.damaged == [], "\n".join(killed.damaged)
    assert killed.resumed == sorted(killed.resumed)
    assert_same_params(read_params(f"{gcs}/jobs/killed"), read_params(tmp_path / "straight"))


def _flip_a_byte(job: str, step: int) -> str:
    """Flip one byte in the middle of the step's largest file (array data); its name."""
    sums = json.loads(job_path(f"{job}/checkpoints/{step}/pax_checksums.json").read_text())
    name = max(sums, key=lambda n: sums[n][0])
    target = job_path(f"{job}/checkpoints/{step}/{name}")
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    return name


def test_a_damaged_gs_checkpoint_is_named_passed_over_and_set_aside_by_a_resume(
        gcs, half_trained):
    job = _copy(half_trained, f"{gcs}/jobs/damaged")
    name = _flip_a_byte(job, 20)
    stopped = run_pax("eval", "--job-dir", job, "--set", "task.train.on_damaged_checkpoint='stop'")
    assert stopped.returncode == 2, stopped.stderr
    assert "checkpoint step 20" in stopped.stderr and "is damaged" in stopped.stderr
    assert f"{name} does not match its checksum" in stopped.stderr
    evaluated = run_pax("eval", "--job-dir", job, "--json")  # a reader: it moves nothing
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["step"] == 10
    assert "passing over checkpoint step 20" in evaluated.stderr
    assert job_path(f"{job}/checkpoints/20/commit_success.txt").exists()
    resumed = run_pax("train", *RUN, "--job-dir", job, PART[0], PART[1].format(20))
    assert resumed.returncode == 0, resumed.stderr
    assert f"moved to {job}/damaged_checkpoints/20-" in resumed.stderr
    assert any(o.startswith("damaged_checkpoints/20-") for o in _objects(job))


def test_a_gs_run_restarts_from_a_chosen_step(gcs, half_trained):
    job = _copy(half_trained, f"{gcs}/jobs/rolled")
    again = run_pax("train", *RUN, "--job-dir", job, PART[0], PART[1].format(20),
                    "--restore-checkpoint-step", "10")
    assert again.returncode == 0, again.stderr
    assert f"moved the later checkpoints (steps 20) to {job}/rolled_back_checkpoints" \
        in again.stderr
    assert "resuming from step 10" in again.stdout + again.stderr
    assert any(o.startswith("rolled_back_checkpoints/20-") for o in _objects(job))
    assert job_path(f"{job}/checkpoints/20/commit_success.txt").exists()  # trained again


def test_a_missing_bucket_is_one_line_before_anything_runs(gcs):
    result = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", "gs://no-such-bucket/job")
    assert result.returncode == 2, result.stderr
    assert "cannot be written" in result.stderr and "bucket" in result.stderr


UNUSABLE = [
    ("s3://bucket/job", "s3:// is not a storage Pax can keep a job in"),
    ("gs://", "names no bucket"),
    ("gs://b/job", "'b' is not a GCS bucket name"),
]


def test_a_job_dir_pax_cannot_use_is_refused(tmp_path):
    """Through the ``pax`` command; every unusable kind is the next test's."""
    job_dir, message = UNUSABLE[0]
    result = subprocess.run([str(Path(sys.executable).with_name("pax")), "train", "--exp",
                             "MlpSynthetic", "--job-dir", job_dir], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []  # no local folder named s3: or gs:


@pytest.mark.parametrize(("job_dir", "message"), UNUSABLE, ids=["s3", "no-bucket", "bad-name"])
def test_each_job_dir_pax_cannot_use_is_refused(tmp_path, monkeypatch, job_dir, message):
    """``pax train`` in this process: the usage error (exit 2) the command prints (the test
    above), and no local folder made where the path would have been one."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as refused:
        train(isolated_host(), exp="MlpSynthetic", plugin=None, set_items=[], job_dir=job_dir)
    assert message in str(refused.value) and refused.value.exit_code == 2
    assert list(tmp_path.iterdir()) == []
