"""Every remat policy computes the same loss and gradients as no remat."""

from __future__ import annotations

import jax
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
