"""Every remat policy computes the same loss and gradients as no remat."""

from __future__ import annotations

import jax
import jax.extend
import numpy as np
import pytest
from transformer_helpers import init_params, loss_fn, random_ids, tiny

from pax_transformer.layers.remat import POLICIES


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


def _primitives(jaxpr: jax.extend.core.Jaxpr) -> set[str]:
    """The primitives ``jaxpr`` evaluates, nested jaxprs included."""
    names = {eqn.primitive.name for eqn in jaxpr.eqns}
    for eqn in jaxpr.eqns:
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            names |= _primitives(sub)
    return names


@pytest.mark.parametrize("policy", ["SAVE_NOTHING", "SAVE_DOT_ONLY"])
def test_rotary_angles_are_evaluated_outside_the_layers_loops(policy: str) -> None:
    # The rotation depends on the positions alone: computed once, not again in every layer's
    # forward and rematerialised passes.
    ids = random_ids(length=9)
    model = tiny(scan_layers=True, remat_policy=policy)
    params = init_params(model, ids)
    closed = jax.make_jaxpr(jax.grad(loss_fn(model)))(params, ids)
    bodies = _loop_bodies(closed.jaxpr)
    assert len(bodies) >= 2  # the forward and the backward loop
    assert all({"sin", "cos"}.isdisjoint(_primitives(body)) for body in bodies)
    assert {"sin", "cos"} <= _primitives(closed.jaxpr)
