"""Pax's multislice experiments in small form: 2 processes x 4 CPU devices as 2 slices, through
``pax launch``, train as one process of 8 devices does (consecutive devices standing in for the
slices): the same losses and the same trained parameters, to a rounding; each start record
shows the layout and the megascale settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pax_core.testing import read_metrics, read_params, run_pax

PAX = str(Path(sys.executable).with_name("pax"))
STEPS = 6
SMALL = ["VOCAB_SIZE=256", "MAX_SEQ_LEN=32", "NUM_LAYERS=2", "MODEL_DIMS=64", "HIDDEN_DIMS=128",
         "NUM_HEADS=2", "DIMS_PER_HEAD=32", "PERCORE_BATCH_SIZE=2", "FPROP_DTYPE='float32'",
         f"NUM_TRAIN_STEPS={STEPS}", "SUMMARY_INTERVAL_STEPS=1", f"EVAL_INTERVAL_STEPS={STEPS}",
         f"CHECKPOINT_EVERY_N_STEPS={STEPS}",
         # no warmup: every step moves the weights (by about the learning rate), which the
         # parameters' comparison needs
         "LR_LRED_WARMUP=0"]
EXPERIMENTS = {
    # 2-way data parallelism over DCN, FSDP over the 4 devices of a slice
    "LmCloudSpmdMultislice2B": [],
    # 2 pipeline stages over DCN, one per slice
    "LmCloudSpmdPipelineMultislice2B": ["MICROBATCH_SIZE=2"],
}


def _train(exp: str, job_dir: Path, processes: int) -> subprocess.CompletedProcess:
    sets = [a for item in SMALL + EXPERIMENTS[exp] for a in ("--set", item)]
    command = ["pax", "train", "--plugin", "lm", "--exp", exp, "--job-dir", str(job_dir), *sets]
    if processes == 1:
        return run_pax(*command[1:], timeout=300)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAX_", "MEGASCALE_"))}
    return subprocess.run([PAX, "launch", "--processes", str(processes), "--cpu-devices", "4",
                           "--", *command], capture_output=True, text=True, timeout=300,
                          env={**env, "PAX_STRICT_PLUGINS": "1"})


def _start(job_dir: Path) -> dict:
    return next(r for r in read_metrics(job_dir) if r["kind"] == "start")


@pytest.mark.parametrize("exp", EXPERIMENTS)
def test_two_slices_of_two_processes_train_as_one_process(exp, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    alone, launched = _train(exp, one, 1), _train(exp, two, 2)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert launched.returncode == 0, launched.stderr[-3000:]
    runs = [read_metrics(job) for job in (one, two)]
    for kind in ("train", "eval/test"):
        a, b = ([r for r in records if r["kind"] == kind] for records in runs)
        assert [r["step"] for r in a] == [r["step"] for r in b] and a
        for x, y in zip(a, b, strict=True):
            assert y["loss"] == pytest.approx(x["loss"], rel=1e-5, abs=1e-6), (kind, x["step"])
    # The runs differ only in the order in which float32 gradients are summed across the
    # slices (between processes, or within one), which moves a weight by a rounding or two
    # (seen: at most one ulp of the kernels, 3e-8, and 1.2e-9 on biases near 1.5e-3). Each step
    # moves each weight by about the learning rate (2.5e-4, no warmup), so a slice that trained
    # on other rows, missed the other slice's gradients or decayed differently is off by 1e-6
    # or more: far outside 8 ulps (rtol 1e-6) plus 1e-8.
    got, want = read_params(two), read_params(one)
    assert sorted(got) == sorted(want) and want
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-8, err_msg=name)
    starts = [_start(job) for job in (one, two)]
    assert [s["mesh_layout"] for s in starts] == ["multislice", "multislice"]
    assert "multislice.megascale: MEGASCALE_NUM_SLICES=2" in starts[0]["presets"]
    assert not any("MEGASCALE_SLICE_ID" in p for p in starts[0]["presets"])  # not told
    assert "multislice.megascale: MEGASCALE_SLICE_ID=0" in starts[1]["presets"]  # process 0's
    assert ("multislice.dcn-data-parallel: LIBTPU_INIT_ARGS "
            "--xla_tpu_enable_data_parallel_all_reduce_opt=true") in starts[1]["presets"]
    assert "[p0] preset multislice.megascale: MEGASCALE_NUM_SLICES=2" in launched.stdout


def test_a_preset_is_turned_off_by_name_and_a_value_of_yours_is_kept(tmp_path):
    env_job = tmp_path / "job"
    sets = [a for item in [*SMALL, "NUM_TRAIN_STEPS=1"] for a in ("--set", item)]
    command = [PAX, "train", "--plugin", "lm", "--exp", "LmCloudSpmdMultislice2B", "--job-dir",
               str(env_job), *sets]
    env = {**os.environ, "PAX_STRICT_PLUGINS": "1",
           "PAX_NO_PRESETS": "multislice.async-collectives", "MEGASCALE_NUM_SLICES": "2",
           "LIBTPU_INIT_ARGS": "--xla_tpu_enable_data_parallel_all_reduce_opt=false"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    presets = _start(env_job)["presets"]
    assert "multislice.megascale: MEGASCALE_NUM_SLICES=2 (yours, kept)" in presets
    assert ("multislice.dcn-data-parallel: LIBTPU_INIT_ARGS "
            "--xla_tpu_enable_data_parallel_all_reduce_opt=false (yours, kept)") in presets
    assert not any(p.startswith("multislice.async-collectives") for p in presets)
    typo = subprocess.run(command, capture_output=True, text=True, timeout=300,
                          env={**env, "PAX_NO_PRESETS": "multislice.asyn"})
    assert typo.returncode == 2
    message = typo.stderr.strip().splitlines()[-1]
    assert "PAX_NO_PRESETS names 'multislice.asyn', which is no preset here" in message
    # the presets named are every installed backend's and the layout's
    for preset in ("multislice.async-collectives", "multislice.dcn-data-parallel",
                   "multislice.megascale", "tpu.pax"):
        assert preset in message
    assert message.endswith("(or 'all', or a backend's name for all of its own)")
