"""The accuracy metric's argmax, found in two levels on CPU, is ``jnp.argmax``'s."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from pax_transformer import vocab_argmax as argmax


@pytest.mark.parametrize("vocab", [100, 128, 300, 8192])
def test_two_level_argmax_is_jnp_argmax_ties_included(vocab):
    logits = jnp.round(jax.random.normal(jax.random.key(vocab), (4, 33, vocab)) * 2) / 2
    assert (argmax(logits) == jnp.argmax(logits, -1)).all()


@pytest.mark.parametrize("vocab", [300, 8192])
def test_logits_holding_a_nan_give_the_first_nan_as_jnp_argmax(vocab):
    # XLA:CPU's maximum may pass over a NaN: such logits take the one-level argmax.
    logits = jax.random.normal(jax.random.key(0), (2, 5, vocab))
    logits = logits.at[0, :, vocab // 2].set(jnp.nan).at[:, 1, -1].set(jnp.nan)
    assert (jax.jit(argmax)(logits) == jnp.argmax(logits, -1)).all()
