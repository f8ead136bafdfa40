"""Pax's pipelined LM experiments through `pax train` (pax-pipeline): checkpoints that move
between a pipelined and an unpipelined mesh, stages on different processes, and the pipeline
mistakes a user can make, each one line with exit 2 and nothing written."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from job_runs import assert_same_run, train_job

from pax_core import UsageError
from pax_core.testing import (
    build_run,
    isolated_host,
    read_metrics,
    resolve,
    run_pax,
)

EXP = ["--plugin", "lm", "--exp", "TinyPipelinedLmForTests", "--no-eval-on-test",
       "--set", "SUMMARY_INTERVAL_STEPS=1", "--set", "CHECKPOINT_EVERY_N_STEPS=2"]
UNPIPELINED_MESH = ["--set", "NUM_STAGES=1", "--set", "ICI_MESH_SHAPE=[1,1,4,2]"]


def _train(job_dir: Path, steps: int, *extra: str) -> subprocess.CompletedProcess:
    return train_job(EXP, job_dir, steps, *extra)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """4 steps on 2 stages x (data 2, mdl 2), one process, not interrupted."""
    job_dir = tmp_path_factory.mktemp("pipelined") / "job"
    result = _train(job_dir, 4)
    assert "placement: pipeline_schedule=gpipe, pipeline_stages=2" in result.stdout
    assert "pipeline_bubble=0.2" in result.stdout
    start = read_metrics(job_dir)[0]
    assert (start["kind"], start["pipeline_stages"], start["pipeline_microbatches"],
            start["pipeline_iterations"], start["pipeline_bubble"]) == ("start", 2, 4, 5, 0.2)
    return job_dir


def test_a_checkpoint_moves_from_a_pipelined_to_an_unpipelined_mesh(straight, tmp_path):
    job_dir = tmp_path / "job"
    _train(job_dir, 2)
    resumed = _train(job_dir, 4, *UNPIPELINED_MESH)
    assert "resuming from step 2" in resumed.stdout
    assert "pipeline_stages=1" in resumed.stdout
    assert_same_run(job_dir, straight, 4)


def test_a_pipelined_job_decodes(straight):
    result = run_pax("decode", "--plugin", "lm", "--job-dir", str(straight), "--prompt", "And",
                     "--max-decode-steps", "8")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("[step 4] And")


def test_stages_on_two_processes_train_as_one_process(straight, tmp_path):
    """`pax launch`: process 0 holds stage 0's four devices, process 1 stage 1's."""
    job_dir = tmp_path / "job"
    pax = str(Path(sys.executable).with_name("pax"))
    result = subprocess.run([pax, "launch", "--processes", "2", "--cpu-devices", "4", "--",
                             "pax", "train", *EXP, "--job-dir", str(job_dir), "--set",
                             "NUM_TRAIN_STEPS=4"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_same_run(job_dir, straight, 4)


@pytest.fixture(scope="module")
def host():
    return isolated_host(*((name, importlib.import_module(f"pax_{name}.plugin"))
                           for name in ("lm", "transformer", "pipeline")))


@pytest.mark.parametrize(("overrides", "message"), [
    (["NUM_LAYERS=3"], "3 layers do not split over 2 stages x 1 circular repeats; NUM_LAYERS "
                       "must be a multiple of 2"),
    (["NUM_MICROBATCHES=3"], "dataset 'train': a batch of 8 does not split into 3 "
                             "microbatches"),
    (["NUM_MICROBATCHES=None", "MICROBATCH_SIZE=3"], "does not split into microbatches of 3"),
    (["CIRCULAR_REPEAT=2", "NUM_MICROBATCHES=1"], "at least as many microbatches as stages"),
    (["MICROBATCH_SIZE=2"], "set exactly one of num_microbatches and microbatch_size"),
    (["NUM_MICROBATCHES=None"], "set exactly one of num_microbatches and microbatch_size"),
    (["STREAM_IO=True", "NUM_MICROBATCHES=1"], "STREAM_IO needs the microbatches"),
    (["NUM_STAGES=4"], "NUM_STAGES is 4 but the mesh's 'stage' axis has 2 devices"),
    (["MESH_AXIS_NAMES=('replica','data','mdl')", "ICI_MESH_SHAPE=[1,4,2]"],
     "PARTITIONER 'pipeline' needs a 'stage' mesh axis"),
])
def test_pipeline_mistakes_are_usage_errors(host, overrides, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_run(host, resolve(host, "TinyPipelinedLmForTests", "lm", overrides),
                  jax.devices(), read_data=False)


def test_a_pipeline_mistake_is_one_line_and_writes_nothing(tmp_path):
    job_dir = tmp_path / "job"
    result = run_pax("train", *EXP, "--job-dir", str(job_dir), "--set", "NUM_MICROBATCHES=3")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "pax: error: dataset 'train': a batch of 8 does not split into 3 microbatches "
        "(NUM_MICROBATCHES); change MICROBATCH_SIZE or NUM_MICROBATCHES, or the batch size"]
    assert not job_dir.exists() or not any(job_dir.iterdir())
