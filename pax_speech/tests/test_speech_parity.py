"""The same recognizer gives the same numbers on every mesh: SPMD and the data-parallel path on
8 fake devices against one device, the batch norm statistics of the convolution modules (over
the valid frames of the whole batch) and the length buckets' several shapes included. Dropout
and SpecAugment are off: like any random draw per row, their masks depend on how the batch is
split over devices."""

from __future__ import annotations

import importlib

import jax
import numpy as np
import pytest

from pax_core.testing import build_run, isolated_host, resolve

STEPS = 3


@pytest.fixture(scope="module")
def host():
    return isolated_host(("speech", importlib.import_module("pax_speech.plugin")),
                         ("transformer", importlib.import_module("pax_transformer.plugin")))


def _train(host, data, partitioner: str, mesh: list[int] | None, devices: list,
           normalisation: str):
    resolved = resolve(host, "TinySpeechForTests", "speech", [
        f"PARTITIONER='{partitioner}'", f"ICI_MESH_SHAPE={mesh}", "BATCH_SIZE=8",
        f"DATA_DIR='{data}'", "DROPOUT_RATE=0.0", "SPEC_AUGMENT=False",
        f"NORMALISATION='{normalisation}'",
        "BUCKET_SECONDS=(0.6, 1.5)"])
    run = build_run(host, resolved, devices)
    state, losses, shapes = run.init_state(), [], set()
    steps = {}
    for _ in range(STEPS):
        batch = run.partitioner.global_batch(run.train_input.get_next())
        shape = batch["audio"].shape
        if shape not in steps:
            spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
            steps[shape] = run.compile_train_step(donate_state=False, batch_spec=spec)
        state, metrics = steps[shape](state, batch)
        losses.append(float(metrics["loss"]))
        shapes.add(shape)
    return losses, jax.device_get(state.params), jax.device_get(state.model_state), shapes


def test_meshes_match_one_device(host, tone_data):
    """With global normalisation: batch statistics both in the front end and in every
    convolution module (per-utterance normalisation has no batch dependence to test)."""
    normalisation = "global"
    want_losses, want_params, want_stats, shapes = _train(
        host, tone_data, "spmd", [1, 1, 1], jax.devices()[:1], normalisation)
    assert len(shapes) == 2, "the steps cover both length buckets"
    moved = jax.tree.leaves(want_stats["batch_stats"]["encoder"]["layer_0"])
    assert all(np.abs(m - np.round(m)).max() > 0 for m in moved), "statistics updated"
    for partitioner, mesh in (("spmd", [1, 4, 2]), ("data_parallel", None)):
        losses, params, stats, _ = _train(host, tone_data, partitioner, mesh, jax.devices(),
                                          normalisation)
        np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
        for got, want in zip(jax.tree.leaves((params, stats)),
                             jax.tree.leaves((want_params, want_stats)), strict=True):
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
