"""FP8 projections: Flax's delayed scaling checked against a re-derivation with jnp's float8
casts, where the FP8 state lives, loop == scan, and the numbers against float32."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.linen import fp8_ops
from transformer_helpers import init_params, random_ids, tiny

from pax_transformer import stack_layer_params
from pax_transformer.layers.dense import Projection
from pax_transformer.layers.initializers import dense_init

OWG = fp8_ops.OVERWRITE_WITH_GRADIENT
E4M3 = jnp.float8_e4m3fn


def _scaled_e4m3(x: jax.Array, scale: float) -> jax.Array:
    """x rounded to e4m3 after dividing by ``scale`` (clipped to its range), scaled back."""
    top = float(jnp.finfo(E4M3).max)
    return jnp.clip(x / scale, -top, top).astype(E4M3).astype(jnp.float32) * scale


def test_a_projection_multiplies_scaled_e4m3_values():
    x = 3.0 * jax.random.normal(jax.random.key(0), (4, 6, 16))
    layer = Projection((2, 8), ("embed",), ("heads", "kv"), dense_init(None),
                       fp8_amax_history=4)
    variables = nn.unbox(layer.init(jax.random.key(1), x))
    kernel = variables["params"]["kernel"]
    # A history whose largest entries give the scales this call uses: amax / e4m3's max.
    history = {"input_amax_history": jnp.asarray([0.0, 900.0, 5.0, 0.0]),
               "kernel_amax_history": jnp.asarray([2.0, 0.0, 0.0, 0.0])}
    state = {"fp8": {**variables[OWG]["fp8"], **history}}
    got = layer.apply({"params": variables["params"], OWG: state}, x)
    top = float(jnp.finfo(E4M3).max)
    want = jnp.tensordot(_scaled_e4m3(x, 900.0 / top), _scaled_e4m3(kernel, 2.0 / top), axes=1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not np.allclose(got, jnp.tensordot(x, kernel, axes=1), rtol=1e-3)


@pytest.mark.parametrize("scan", [False, True], ids=["loop", "scan"])
def test_every_block_projection_has_fp8_state_and_nothing_else(scan: bool):
    model = tiny(fp8=True, fp8_amax_history=8, scan_layers=scan, gated=True)
    shapes = jax.eval_shape(model.init, jax.random.key(0), random_ids())[OWG]["stack"]
    layer = shapes["layers"] if scan else shapes["layer_0"]
    assert set(shapes) == ({"layers"} if scan else {"layer_0", "layer_1"})
    assert {k: sorted(v) for k, v in layer.items()} == {
        "attention": ["key", "out", "query", "value"], "ffn": ["wi", "wi_gate", "wo"]}
    history = layer["ffn"]["wo"]["fp8"]["kernel_amax_history"]
    assert history.shape == ((2, 8) if scan else (8,))


def _fp8_variables(model, ids, seed: int = 0):
    """float32 weights of the tiny model, and FP8 state after one step's forward (amax
    histories holding those values' maxima, so that the scales are in use)."""
    params = init_params(model, ids, seed)
    state = jax.eval_shape(model.init, jax.random.key(0), ids)[OWG]
    state = jax.tree.map(lambda s: jnp.ones(s.shape, s.dtype), state)

    def loss(p, s):
        return jnp.mean(model.apply({"params": p, OWG: s}, ids) ** 2)

    return params, jax.jit(jax.grad(loss, argnums=1))(params, state)


def test_loop_and_scan_compute_the_same_fp8_function():
    ids = random_ids(2, 8)
    looped, scanned = tiny(fp8=True, fp8_amax_history=4), tiny(fp8=True, fp8_amax_history=4,
                                                               scan_layers=True)
    params, state = _fp8_variables(looped, ids)
    stacked = {**params, "stack": stack_layer_params(params["stack"])}
    stacked_state = {"stack": stack_layer_params(state["stack"])}
    np.testing.assert_allclose(
        jax.jit(scanned.apply)({"params": stacked, OWG: stacked_state}, ids),
        jax.jit(looped.apply)({"params": params, OWG: state}, ids), rtol=1e-5, atol=1e-5)


def _loss(model, params, state, ids):
    variables = {"params": params} if state is None else {"params": params, OWG: state}
    logits = model.apply(variables, ids[:, :-1])
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))


def test_fp8_logits_and_gradients_stay_close_to_float32():
    ids = random_ids(4, 16)
    fp8, full = tiny(fp8=True, fp8_amax_history=4), tiny()
    params, state = _fp8_variables(fp8, ids)
    logits = jax.jit(fp8.apply)({"params": params, OWG: state}, ids)
    reference = jax.jit(full.apply)({"params": params}, ids)
    error = float(jnp.linalg.norm(logits - reference) / jnp.linalg.norm(reference))
    assert 1e-4 < error < 0.1  # quantized (e4m3 keeps 3 mantissa bits), yet close
    grad = jax.jit(jax.grad(_loss, argnums=1), static_argnums=0)
    got, want = grad(fp8, params, state, ids), grad(full, params, None, ids)
    flat_got, flat_want = (jnp.concatenate([g.ravel() for g in jax.tree.leaves(t)])
                           for t in (got, want))
    cosine = float(flat_got @ flat_want / (jnp.linalg.norm(flat_got) * jnp.linalg.norm(flat_want)))
    assert cosine > 0.98


def test_the_compiled_gradient_multiplies_e4m3_and_e5m2():
    ids = random_ids(2, 8)
    model = tiny(fp8=True, fp8_amax_history=4, scan_layers=True)
    params, state = _fp8_variables(model, ids)
    hlo = jax.jit(jax.grad(_loss, argnums=(1, 2)), static_argnums=0).lower(
        model, params, state, ids).as_text()
    assert "f8E4M3FN" in hlo and "f8E5M2" in hlo


@pytest.mark.parametrize(("fields", "message"), [
    (dict(fp8=True, fp8_amax_history=0), "fp8_amax_history must be a positive"),
    (dict(fp8=True, stack=lambda *a, **k: None), "fp8 runs in pax-transformer's own"),
])
def test_unusable_fp8_settings_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        tiny(**fields)
