"""The same classifier gives the same numbers on every mesh: SPMD and the data-parallel path on
8 fake devices against one device, batch norm's statistics (averaged across the data-parallel
devices) included."""

from __future__ import annotations

import importlib

import jax
import numpy as np
import pytest

from pax_core.testing import build_run, isolated_host, resolve

STEPS = 3


@pytest.fixture(scope="module")
def host():
    return isolated_host(("vision", importlib.import_module("pax_vision.plugin")),
                         ("transformer", importlib.import_module("pax_transformer.plugin")))


def _train(host, exp: str, partitioner: str, mesh: list[int] | None, devices: list):
    resolved = resolve(host, exp, "vision", [f"PARTITIONER='{partitioner}'",
                                             f"ICI_MESH_SHAPE={mesh}", "BATCH_SIZE=16"])
    run = build_run(host, resolved, devices)
    step = run.compile_train_step(donate_state=False)
    state, losses = run.init_state(), []
    for _ in range(STEPS):
        state, metrics = step(state, run.partitioner.global_batch(run.train_input.get_next()))
        losses.append(float(metrics["loss"]))
    return losses, jax.device_get(state.params), jax.device_get(state.model_state)


@pytest.mark.parametrize("exp", ["TinyResNetForTests", "TinyViTForTests"])
def test_meshes_match_one_device(host, exp):
    pytest.importorskip("sklearn", reason="needs scikit-learn (pax-vision's digits extra), "
                                          "whose digits the tiny models train on")
    want_losses, want_params, want_stats = _train(host, exp, "spmd", [1, 1, 1],
                                                  jax.devices()[:1])
    if exp == "TinyResNetForTests":
        assert jax.tree.leaves(want_stats), "the ResNet keeps batch statistics"
        moved = jax.tree.leaves(want_stats["batch_stats"]["backbone"]["entry_norm"])
        assert all(np.abs(m - np.round(m)).max() > 0 for m in moved), "statistics updated"
    for partitioner, mesh in (("spmd", [1, 4, 2]), ("data_parallel", None)):
        losses, params, stats = _train(host, exp, partitioner, mesh, jax.devices())
        np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
        for got, want in zip(jax.tree.leaves((params, stats)),
                             jax.tree.leaves((want_params, want_stats)), strict=True):
            np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
