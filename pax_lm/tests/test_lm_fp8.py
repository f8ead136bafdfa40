"""USE_FP8: the LM trains with FP8 projections, on every partitioner alike, learns about as
well as in float32, checkpoints its scales and decodes with them."""

from __future__ import annotations

import importlib
from pathlib import Path

import jax
import numpy as np
import pytest
from flax.linen import fp8_ops

from pax_core.testing import build_run, isolated_host, read_metrics, resolve, run_pax, train

OWG = fp8_ops.OVERWRITE_WITH_GRADIENT
STEPS = 3


@pytest.fixture(scope="module")
def host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")),
                         ("transformer", importlib.import_module("pax_transformer.plugin")))


def _steps(host, devices: list, *settings: str):
    """Losses and the FP8 state after STEPS training steps of the tiny LM with USE_FP8 (its
    vocabulary already a multiple of 128, so that no mesh pads it)."""
    resolved = resolve(host, "TinyLmForTests", "lm", ["USE_FP8=True", "VOCAB_SIZE=384",
                                                     *settings])
    run = build_run(host, resolved, devices)
    state, step = run.init_state(), run.compile_train_step(donate_state=False)
    losses = []
    for _ in range(STEPS):
        state, metrics = step(state, run.partitioner.global_batch(run.train_input.get_next()))
        losses.append(float(metrics["loss"]))
    return losses, jax.device_get(state.model_state[OWG])


@pytest.fixture(scope="module")
def one_device(host):
    return _steps(host, jax.devices()[:1])


@pytest.mark.parametrize("settings", [
    ("PARTITIONER='spmd'", "ICI_MESH_SHAPE=[1,4,2]"), ("PARTITIONER='data_parallel'",)],
    ids=["spmd-4x2", "data-parallel-8"])
def test_fp8_runs_alike_on_every_partitioner(host, one_device, settings):
    losses, state = _steps(host, jax.devices(), *settings)
    want_losses, want_state = one_device
    # FP8 rounds each quantized value to 3 mantissa bits, so another summation order can
    # move a value across a rounding boundary: close, not bitwise.
    np.testing.assert_allclose(losses, want_losses, rtol=2e-3)
    layer = ("decoder", "stack", "layer_0", "ffn", "wi", "fp8")

    def history(tree, name):
        for key in layer:
            tree = tree[key]
        return tree[name]

    for name in ("input_amax_history", "kernel_amax_history"):
        np.testing.assert_allclose(history(state, name), history(want_state, name), rtol=2e-3)


@pytest.fixture(scope="module")
def fp8_job(host, tmp_path_factory):
    job_dir = tmp_path_factory.mktemp("fp8_lm")
    train(host, exp="TinyLmForTests", plugin="lm", job_dir=str(job_dir),
          set_items=["USE_FP8=True", "NUM_TRAIN_STEPS=30"])
    return job_dir


def _losses(job_dir: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(job_dir) if r["kind"] == "train"]


def test_fp8_learns_about_as_well_as_float32(host, fp8_job, tmp_path):
    train(host, exp="TinyLmForTests", plugin="lm", job_dir=str(tmp_path),
          set_items=["NUM_TRAIN_STEPS=30"])
    fp8, full = _losses(fp8_job), _losses(tmp_path)
    assert fp8[-1] < fp8[0] - 0.5
    assert abs(fp8[-1] - full[-1]) < 0.05 * full[-1]
    assert fp8 != full  # the projections did run in FP8


def test_an_fp8_job_decodes_with_its_scales(fp8_job):
    result = run_pax("decode", "--plugin", "lm", "--job-dir", str(fp8_job), "--prompt", "And God",
                     "--max-decode-steps", "8")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("[step 30] And God")


def test_fp8_in_a_pipeline_is_one_line(tmp_path):
    result = run_pax("train", "--plugin", "lm", "--exp", "TinyPipelinedLmForTests",
                     "--job-dir", str(tmp_path / "job"), "--set", "USE_FP8=True")
    assert result.returncode == 2, result.stderr
    assert "fp8 runs in pax-transformer's own layer stack only" in result.stderr
    assert not (tmp_path / "job").exists()
