"""The train step carries Flax's ``_overwrite_with_gradient`` collection (FP8 scales and amax
histories) as the values its gradient gives, never through the optimizer: checked against the
maxima of the very tensors the step quantizes, computed here independently."""

from __future__ import annotations

from types import SimpleNamespace

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.linen import fp8_ops

from pax_core.models.output import ModelOutput
from pax_core.parallel.data_parallel import DataParallel
from pax_core.run.state import make_init_fn
from pax_core.run.steps import make_train_step

E4M3_MAX = float(jnp.finfo(jnp.float8_e4m3fn).max)
HISTORY = 4
OWG = fp8_ops.OVERWRITE_WITH_GRADIENT


class Fp8Regression(nn.Module):
    """One FP8 matmul and a squared error: the smallest model with FP8 state."""

    @nn.compact
    def __call__(self, batch, train: bool = False) -> ModelOutput:
        kernel = self.param("kernel", nn.initializers.normal(1.0), (8, 4))
        y = fp8_ops.Fp8DirectDotGeneralOp(amax_history_length=HISTORY, name="fp8")(
            batch["x"], kernel, (((1,), (0,)), ((), ())))
        loss = jnp.mean((y - batch["y"]) ** 2)
        return ModelOutput(loss, {"mse": (loss, jnp.ones(()))})


def _batch(seed: int, rows: int = 16) -> dict[str, jax.Array]:
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    # Rows grow in size, so each shard and each microbatch has its own largest magnitude.
    scale = jnp.linspace(0.5, 3.0, rows)[:, None]
    return {"x": scale * jax.random.normal(kx, (rows, 8)), "y": jax.random.normal(ky, (rows, 4))}


def _state():
    model, tx = Fp8Regression(), optax.adam(1e-2)
    spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in _batch(0).items()}
    return model, tx, nn.meta.unbox(jax.jit(make_init_fn(model, tx, spec))(0))


def _amax(x: jax.Array) -> float:
    return float(jnp.max(jnp.abs(x)))


def _owg(state) -> dict[str, np.ndarray]:
    return jax.tree.map(np.asarray, state.model_state[OWG]["fp8"])


def test_one_step_records_the_maxima_and_leaves_the_optimizer_out():
    model, tx, state = _state()
    kernel0, batch = state.params["kernel"], _batch(1)
    new = jax.jit(make_train_step(model, tx, lambda step: 1e-2))(state, batch)[0]
    owg = _owg(new)
    np.testing.assert_allclose(owg["kernel_amax_history"], [_amax(kernel0), 0, 0, 0])
    np.testing.assert_allclose(owg["input_amax_history"], [_amax(batch["x"]), 0, 0, 0])
    assert owg["output_grad_amax_history"][0] > 0
    # An empty history keeps the scales (1) for the first step.
    np.testing.assert_array_equal(owg["kernel_scale"], [1.0])
    assert jax.tree.structure(new.opt_state[0].mu) == jax.tree.structure(new.params)
    assert not np.allclose(new.params["kernel"], kernel0)


def test_the_next_scale_comes_from_the_history():
    model, tx, state = _state()
    kernel0, first = state.params["kernel"], _batch(1)
    step = jax.jit(make_train_step(model, tx, lambda step: 1e-2))
    state = step(step(state, first)[0], _batch(2))[0]
    owg = _owg(state)
    np.testing.assert_allclose(owg["kernel_scale"], [_amax(kernel0) / E4M3_MAX], rtol=1e-6)
    np.testing.assert_allclose(owg["input_scale"], [_amax(first["x"]) / E4M3_MAX], rtol=1e-6)
    # Flax's history is a ring: the newest at 0, the one before it at the end.
    np.testing.assert_allclose(owg["input_amax_history"][-1], _amax(first["x"]))


def test_microbatches_chain_the_history():
    """Each microbatch is one update of the history, in order; summing their gradients (as
    for the weights) would double the kernel's entry and mix the inputs'."""
    model, tx, state = _state()
    kernel0, batch = state.params["kernel"], _batch(1)
    step = jax.jit(make_train_step(model, tx, lambda step: 1e-2, num_microbatches=2))
    owg = _owg(step(state, batch)[0])
    # Microbatch m takes rows m, m + 2, m + 4, ... (the step's split).
    first, second = batch["x"][0::2], batch["x"][1::2]
    np.testing.assert_allclose(owg["kernel_amax_history"], [_amax(kernel0), 0, 0, _amax(kernel0)])
    np.testing.assert_allclose(owg["input_amax_history"], [_amax(second), 0, 0, _amax(first)])


@pytest.mark.skipif(jax.device_count() < 8, reason="needs 8 devices")
def test_data_parallel_shards_agree_on_the_global_maximum():
    model, tx, state = _state()
    partitioner = DataParallel()
    partitioner.setup(SimpleNamespace(ICI_MESH_SHAPE=None, DCN_MESH_SHAPE=None,
                                      MESH_AXIS_NAMES=()), jax.devices()[:8])
    replicated = jax.tree.map(lambda _: partitioner.replicated, state)
    batch = _batch(1)
    step = partitioner.compile_step(
        make_train_step(model, tx, lambda step: 1e-2, reduction=partitioner.reduction),
        replicated, {k: partitioner.batch_sharding(2) for k in batch},
        (replicated, partitioner.replicated))
    spmd = jax.jit(make_train_step(model, tx, lambda step: 1e-2))(state, batch)[0]
    owg = _owg(step(state, batch)[0])
    # The last shard holds the largest rows, so the maximum is the global one only if the
    # shards' maxima were combined.
    np.testing.assert_allclose(owg["input_amax_history"][0], _amax(batch["x"]))
    np.testing.assert_allclose(owg["kernel_amax_history"], _owg(spmd)["kernel_amax_history"])


def test_a_skipped_step_keeps_the_history():
    model, tx, state = _state()
    batch = {**_batch(1), "y": jnp.full((16, 4), jnp.nan)}
    step = jax.jit(make_train_step(model, tx, lambda step: 1e-2, skip_anomalies=True))
    new, metrics = step(state, batch)
    assert float(metrics["anomalous"]) == 1.0
    np.testing.assert_array_equal(_owg(new)["kernel_amax_history"], np.zeros(HISTORY))
