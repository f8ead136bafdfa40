"""Every remat policy computes the same loss and gradients as no remat."""

from __future__ import annotations

import contextlib

import flax.linen as nn
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals
from transformer_helpers import init_params, loss_fn, random_ids, tiny

from pax_core.testing import splash_served
from pax_transformer import Attention
from pax_transformer.layers.remat import POLICIES, remat_policy


@pytest.fixture(scope="module")
def reference() -> tuple:
    ids = random_ids(length=9)
    model = tiny(scan_layers=True)
    params = init_params(model, ids)
    loss, grads = jax.jit(jax.value_and_grad(loss_fn(model)))(params, ids)
    return ids, params, loss, grads


@pytest.mark.parametrize("policy", list(POLICIES))
def test_policy_keeps_loss_and_gradients(policy: str, reference: tuple) -> None:
    ids, params, expected_loss, expected_grads = reference
    model = tiny(scan_layers=True, remat_policy=policy)
    loss, grads = jax.jit(jax.value_and_grad(loss_fn(model)))(params, ids)
    np.testing.assert_allclose(loss, expected_loss, atol=1e-6)
    jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, atol=1e-6), grads, expected_grads)


def test_policy_in_a_looped_stack_keeps_gradients() -> None:
    ids = random_ids(length=9)
    plain, remat = tiny(), tiny(remat_policy="SAVE_DOT_FOR_MLPERF_200B")
    params = init_params(plain, ids)
    expected = jax.jit(jax.grad(loss_fn(plain)))(params, ids)
    got = jax.jit(jax.grad(loss_fn(remat)))(params, ids)
    jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, atol=1e-6), got, expected)


def _loop_bodies(jaxpr: jax.extend.core.Jaxpr) -> list[jax.extend.core.Jaxpr]:
    """Every scan body in ``jaxpr``, nested ones included."""
    found = []
    for eqn in jaxpr.eqns:
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            if eqn.primitive.name == "scan":
                found.append(sub)
            found.extend(_loop_bodies(sub))
    return found


def _equations(jaxpr: jax.extend.core.Jaxpr) -> list:
    """The equations ``jaxpr`` evaluates, nested jaxprs' included."""
    found = list(jaxpr.eqns)
    for eqn in jaxpr.eqns:
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _equations(sub)
    return found


def _primitives(jaxpr: jax.extend.core.Jaxpr) -> set[str]:
    """The primitives ``jaxpr`` evaluates, nested jaxprs included."""
    return {eqn.primitive.name for eqn in _equations(jaxpr)}


# Gemma 3's layers: every second one global, the sliding ones with a rotary base of their own,
# chosen by the scanned layer index (both rotations computed outside, one selected inside).
LOCAL_ROTARY = {"sliding_window": 4, "global_every": 2, "local_rotary_base": 10.0}


@pytest.mark.parametrize(("policy", "fields"), [("SAVE_NOTHING", {}), ("SAVE_DOT_ONLY", {}),
                                                ("SAVE_NOTHING", LOCAL_ROTARY)],
                         ids=["nothing", "dots", "nothing-local-rotary"])
def test_rotary_angles_are_evaluated_outside_the_layers_loops(policy: str, fields: dict) -> None:
    # The rotation depends on the positions alone: computed once, not again in every layer's
    # forward and rematerialised passes.
    ids = random_ids(length=9)
    model = tiny(scan_layers=True, remat_policy=policy, **fields)
    params = init_params(model, ids)
    closed = jax.make_jaxpr(jax.grad(loss_fn(model)))(params, ids)
    bodies = _loop_bodies(closed.jaxpr)
    assert len(bodies) >= 2  # the forward and the backward loop
    assert all({"sin", "cos"}.isdisjoint(_primitives(body)) for body in bodies)
    assert {"sin", "cos"} <= _primitives(closed.jaxpr)
    # Without positions of their own the rows share the decoder's, and one row's angles.
    rows = {eqn.outvars[0].aval.shape[0] for eqn in _equations(closed.jaxpr)
            if eqn.primitive.name in ("sin", "cos")}
    assert ids.shape[0] > 1 and rows == {1}, rows


@pytest.mark.parametrize("splash", [False, True], ids=["xla", "splash"])
def test_a_layer_keeps_its_attention_output_once(splash, capsys):
    """Under ``SAVE_CONTEXT_AND_OUT_PROJ`` a transformer layer keeps one copy of the attention's
    output for its backward pass: what the backend names (Splash's output in the kernel's
    layout, or XLA's), not that and the layer's context in another layout besides."""
    length = 256
    layer = Attention(num_heads=2, num_kv_heads=2, dim_per_head=32, max_seq_len=length,
                      kernel_init=nn.initializers.normal(0.02))
    x = jax.random.normal(jax.random.PRNGKey(0), (1, length, 64))
    positions = jnp.arange(length)[None]
    params = layer.init(jax.random.PRNGKey(1), x, positions)

    def loss(params, x):
        return jnp.sin(layer.apply(params, x, positions)).sum()

    with splash_served() if splash else contextlib.nullcontext():
        print_saved_residuals(
            jax.checkpoint(loss, policy=remat_policy("SAVE_CONTEXT_AND_OUT_PROJ")), params, x)
    shapes = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    outputs = [s for s in shapes if s in (f"f32[1,{length},2,32]", f"f32[1,2,{length},32]")]
    assert len(outputs) == 1, shapes
