"""The accuracy metric's argmax, found in two levels on CPU, is ``jnp.argmax``'s."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from pax_lm.models import argmax


@pytest.mark.parametrize("vocab", [100, 128, 300, 8192])
def test_two_level_argmax_is_jnp_argmax_ties_included(vocab):
    logits = jnp.round(jax.random.normal(jax.random.key(vocab), (4, 33, vocab)) * 2) / 2
    assert (argmax(logits) == jnp.argmax(logits, -1)).all()
