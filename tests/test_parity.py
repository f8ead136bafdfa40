"""The same model gives the same numbers on every mesh: SPMD meshes and the data-parallel path
against one device (float32, 8 fake CPU devices), and checkpoints move between meshes."""

from __future__ import annotations

import importlib

import jax
import numpy as np
import pytest

from pax_core.config.resolve import resolve
from pax_core.run.build import build_run
from pax_core.testing import isolated_host

STEPS = 5
GLOBAL_BATCH = 16


@pytest.fixture(scope="module")
def host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")),
                         ("transformer", importlib.import_module("pax_transformer.plugin")))


def _run(host, partitioner: str, mesh: list[int] | None, devices: list):
    per_core = GLOBAL_BATCH / len(devices)
    resolved = resolve(host, "LmCloudSpmdTest", "lm", [
        f"PARTITIONER='{partitioner}'", f"ICI_MESH_SHAPE={mesh}", f"PERCORE_BATCH_SIZE={per_core}",
        "VOCAB_SIZE=256", "MAX_SEQ_LEN=32", "FPROP_DTYPE='float32'",
    ])
    return build_run(host, resolved, devices)


def _grads_and_losses(run):
    """Gradients at the initial state, then the losses of STEPS training steps."""
    partitioner, model = run.partitioner, run.task.model
    batch_shardings = run.batch_shardings(run.batch_spec)

    def grads(state, batch):
        def loss(params):
            return model.apply({"params": params}, batch, train=True,
                               rngs={"dropout": state.rng}).loss

        return partitioner.reduction.gradients(jax.grad(loss)(state.params))

    state = run.init_state()
    first = run.partitioner.global_batch(run.train_input.peek())
    at_init = partitioner.compile_step(grads, run.state_shardings, batch_shardings,
                                       run.state_shardings.params)(state, first)
    step = run.compile_train_step(donate_state=False)
    losses = []
    for _ in range(STEPS):
        state, metrics = step(state, partitioner.global_batch(run.train_input.get_next()))
        losses.append(float(metrics["loss"]))
    return jax.device_get(at_init), losses, jax.device_get(state.params)


@pytest.fixture(scope="module")
def one_device(host):
    return _grads_and_losses(_run(host, "spmd", [1, 1, 1], jax.devices()[:1]))


@pytest.mark.parametrize(
    ("partitioner", "mesh"),
    [("spmd", [8, 1, 1]), ("spmd", [1, 8, 1]), ("spmd", [1, 4, 2]), ("spmd", [2, 2, 2]),
     ("data_parallel", None)],
)
def test_mesh_matches_one_device(host, one_device, partitioner, mesh):
    run = _run(host, partitioner, mesh, jax.devices())
    grads, losses, _ = _grads_and_losses(run)
    expected_grads, expected_losses, _ = one_device
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(expected_grads), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_weights_are_sharded_as_pax_shards_them(host):
    run = _run(host, "spmd", [1, 4, 2], jax.devices())
    layer = run.state_shardings.params["decoder"]["stack"]["layers"]
    assert layer["ffn"]["wi"]["kernel"].spec == jax.sharding.PartitionSpec(None, "data", "mdl")
    assert layer["attention"]["query"]["kernel"].spec == jax.sharding.PartitionSpec(
        None, "data", "mdl", None)
    embedding = run.state_shardings.params["decoder"]["embedding"]["embedding"]
    assert embedding.spec == jax.sharding.PartitionSpec("mdl", "data")
    mu = run.state_shardings.opt_state
    assert jax.sharding.PartitionSpec(None, "data", "mdl") in {
        s.spec for s in jax.tree.leaves(mu)}
    assert run.batch_shardings(run.batch_spec)["ids"].spec == jax.sharding.PartitionSpec(
        ("replica", "data"), None)


def test_checkpoint_moves_to_another_mesh(host, tmp_path):
    first = _run(host, "spmd", [1, 8, 1], jax.devices())
    state = first.init_state()
    checkpointer = first.make_checkpointer(str(tmp_path))
    checkpointer.save(3, state, first.train_input.get_state())
    checkpointer.close()
    second = _run(host, "spmd", [1, 2, 2], jax.devices()[:4])
    restorer = second.make_checkpointer(str(tmp_path))
    restored, _ = restorer.restore(3, second.abstract_state)
    restorer.close()
    kernel = restored.params["decoder"]["stack"]["layers"]["ffn"]["wi"]["kernel"]
    assert kernel.sharding.mesh.size == 4
    for got, want in zip(jax.tree.leaves(restored.params), jax.tree.leaves(state.params),
                         strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["ICI_MESH_SHAPE=[1,3,1]"], "has 3 devices but 8 are available; change ICI_MESH_SHAPE"),
        (["ICI_MESH_SHAPE=[1,1,8]", "PERCORE_BATCH_SIZE=2", "HIDDEN_DIMS=260"],
         "a dimension of 260 does not divide over mesh axes ['mdl'] (8 devices); change "
         "ICI_MESH_SHAPE"),
        (["ICI_MESH_SHAPE=[1,8,1]", "LOGICAL_AXIS_RULES=(('batch', 'dta'),)"],
         "mesh axis 'dta'"),
        (["ICI_MESH_SHAPE=[1,8,1]", "LOGICAL_AXIS_RULES=(('batch', 'data'),)"],
         "logical axis 'vocab', which LOGICAL_AXIS_RULES does not map"),
        (["ICI_MESH_SHAPE=[1,4,1]", "PERCORE_BATCH_SIZE=0.5"],
         "does not divide over the 4 batch shards"),
    ],
)
def test_mesh_mistakes_name_the_constant(host, overrides, message):
    from pax_core.errors import UsageError

    resolved = resolve(host, "LmCloudSpmdTest", "lm",
                              ["PARTITIONER='spmd'", "FPROP_DTYPE='float32'", *overrides])
    devices = jax.devices()[:4] if "[1,4,1]" in str(overrides) else jax.devices()
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]")
                       .replace("(", r"\(").replace(")", r"\)")):
        build_run(host, resolved, devices)
