"""Pax's TransformerLmSpmdAdafactor: the factored optimizer state shards with the model, and a
mesh of 8 devices computes what one device does."""

from __future__ import annotations

import importlib
import textwrap

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from pax_core.testing import build_run, isolated_host, resolve

EXPERIMENT = '''
from pax_lm.experiments.base import TransformerLmSpmdAdafactor
from pax_lm.experiments.lm_cloud import LmCloudSpmdTest


class AdafactorLmTest(TransformerLmSpmdAdafactor, LmCloudSpmdTest):
    LR_SCHEDULE = "constant"
    LEARNING_RATE = 1e-2
'''
STEPS = 4


@pytest.fixture(scope="module")
def host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")),
                         ("transformer", importlib.import_module("pax_transformer.plugin")))


@pytest.fixture(scope="module")
def exp(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("exp") / "adafactor_lm.py"
    path.write_text(textwrap.dedent(EXPERIMENT))
    return f"{path}:AdafactorLmTest"


def _run(host, exp, mesh: list[int], devices: list):
    resolved = resolve(host, exp, None, [
        f"ICI_MESH_SHAPE={mesh}", f"PERCORE_BATCH_SIZE={16 / len(devices)}",
        "VOCAB_SIZE=256", "MAX_SEQ_LEN=32", "FPROP_DTYPE='float32'", "MODEL_DIMS=128",
        "HIDDEN_DIMS=256", "NUM_HEADS=4", "DIMS_PER_HEAD=32"])
    return build_run(host, resolved, devices)


def _train(run):
    step, state, losses = run.compile_train_step(donate_state=False), run.init_state(), []
    for _ in range(STEPS):
        state, metrics = step(state, run.partitioner.global_batch(run.train_input.get_next()))
        losses.append(float(metrics["loss"]))
    return losses, jax.device_get(state.params)


def _adafactor_part(opt_state):
    [state] = [s for s in opt_state if hasattr(s, "v_row")]
    return state


def test_factored_moments_are_replicated_and_full_ones_follow_their_weight(host, exp):
    run = _run(host, exp, [1, 4, 2], jax.devices())
    layer = run.state_shardings.params["decoder"]["stack"]["layers"]["ffn"]["wi"]["kernel"]
    state = _adafactor_part(run.state_shardings.opt_state)
    ffn = lambda tree: tree["decoder"]["stack"]["layers"]["ffn"]["wi"]["kernel"]  # noqa: E731
    assert layer.spec == PartitionSpec(None, "data", "mdl")
    assert ffn(state.m).spec == layer.spec  # momentum (beta1 0.9) is as big as the weight
    assert ffn(state.v_row).spec == PartitionSpec() == ffn(state.v_col).spec
    abstract = _adafactor_part(run.abstract_state.opt_state)
    assert ffn(abstract.v_row).shape == (2, 128) and ffn(abstract.v_col).shape == (2, 256)


def test_eight_devices_train_as_one_does(host, exp):
    one_losses, one_params = _train(_run(host, exp, [1, 1, 1], jax.devices()[:1]))
    losses, params = _train(_run(host, exp, [1, 4, 2], jax.devices()))
    np.testing.assert_allclose(losses, one_losses, rtol=1e-5)
    assert losses[-1] < losses[0]
    for got, want in zip(jax.tree.leaves(params), jax.tree.leaves(one_params), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
