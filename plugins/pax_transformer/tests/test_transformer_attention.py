"""Attention variants: MHA/GQA/MQA, the logit caps, and the einsum path against the fused one."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from transformer_helpers import forward, init_params, random_ids, tiny

from pax_core import dot_product_attention
from pax_transformer.layers.attention import causal_mask, segment_mask


@pytest.mark.parametrize("kv_heads", [None, 2, 1], ids=["mha", "gqa", "mqa"])
def test_head_layouts_have_the_expected_kv_projections(kv_heads: int | None) -> None:
    model = tiny(num_kv_heads=kv_heads)  # 4 heads of 8 dims
    ids = random_ids()
    params = init_params(model, ids)
    attention = params["stack"]["layer_0"]["attention"]
    assert attention["query"]["kernel"].shape == (32, 4, 8)
    assert attention["key"]["kernel"].shape == (32, kv_heads or 4, 8)
    assert attention["value"]["kernel"].shape == (32, kv_heads or 4, 8)
    assert attention["out"]["kernel"].shape == (4, 8, 32)
    logits = forward(model)(params, ids)
    assert logits.shape == (2, 8, 32) and np.isfinite(logits).all()


def test_grouped_query_equals_multi_head_with_repeated_kv_heads() -> None:
    """Query head n reads kv head n // (num_heads // num_kv_heads)."""
    ids = random_ids()
    gqa = tiny(num_kv_heads=2)
    params = init_params(gqa, ids)
    mha_params = jax.tree.map(lambda x: x, params)
    for layer in mha_params["stack"].values():
        for name in ("key", "value"):
            kernel = layer["attention"][name]["kernel"]
            layer["attention"][name]["kernel"] = jnp.repeat(kernel, 2, axis=1)
    np.testing.assert_allclose(
        forward(tiny())(mha_params, ids), forward(gqa)(params, ids), atol=1e-5
    )


def test_attention_logit_cap_bounds_the_attention_weights() -> None:
    """With cap c the logits lie in [-c, c], so no weight is below e^(-2c) times another."""
    length, cap = 6, 1.0
    rng = np.random.default_rng(0)
    query = jnp.asarray(rng.normal(size=(1, length, 2, length)) * 100, jnp.float32)
    key = jnp.asarray(rng.normal(size=(1, length, 1, length)) * 100, jnp.float32)
    # Each value is a one-hot of its slot, so the context *is* the attention weights.
    value = jnp.eye(length, dtype=jnp.float32)[None, :, None, :]
    mask = causal_mask(length, length)
    capped = np.asarray(dot_product_attention(query, key, value, mask=mask, logit_cap=cap))
    uncapped = np.asarray(dot_product_attention(query, key, value, mask=mask))
    for t in range(length):
        weights = capped[0, t, :, : t + 1]
        assert (weights.min(-1) >= weights.max(-1) * np.exp(-2 * cap) * (1 - 1e-5)).all()
        np.testing.assert_allclose(capped[0, t, :, t + 1 :], 0.0, atol=1e-7)
    assert uncapped[0, -1].max() > 0.99  # without the cap one key takes almost everything


def test_logits_soft_cap_bounds_the_logits() -> None:
    ids = random_ids()
    wild = tiny()
    params = init_params(wild, ids, std=2.0)
    assert np.abs(forward(wild)(params, ids)).max() > 10
    capped = forward(tiny(logits_soft_cap=5.0))(params, ids)
    assert np.abs(capped).max() <= 5.0


@pytest.mark.parametrize("kv_heads", [None, 2, 1], ids=["mha", "gqa", "mqa"])
def test_einsum_path_matches_dot_product_attention(kv_heads: int | None) -> None:
    ids = random_ids(length=9)
    segment_ids = jnp.array([[1, 1, 1, 1, 2, 2, 2, 3, 3]] * 2)
    fused = tiny(num_kv_heads=kv_heads)
    params = init_params(fused, ids)
    expected = forward(fused)(params, ids, segment_ids=segment_ids)
    got = forward(tiny(num_kv_heads=kv_heads, attention_logit_cap=1e9))(
        params, ids, segment_ids=segment_ids
    )
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_masks() -> None:
    np.testing.assert_array_equal(causal_mask(2, 3)[0, 0], [[1, 0, 0], [1, 1, 0]])
    np.testing.assert_array_equal(causal_mask(1, 3, offset=1)[0, 0], [[1, 1, 0]])
    np.testing.assert_array_equal(
        segment_mask(jnp.array([[1, 1, 2]]))[0, 0], [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    )


@pytest.mark.parametrize("logit_cap", [0.0, 30.0], ids=["fused", "capped"])
def test_non_causal_attention_sees_later_positions(logit_cap: float) -> None:
    """With ``causal=False`` the first position's output depends on the last input; causal
    attention's does not."""
    from pax_transformer.layers.attention import Attention

    x = jax.random.normal(jax.random.PRNGKey(0), (1, 5, 16))
    later = x.at[:, -1].add(1.0)
    positions = jnp.arange(5)[None]
    for causal in (True, False):
        layer = Attention(num_heads=2, num_kv_heads=2, dim_per_head=8, logit_cap=logit_cap,
                          kernel_init=jax.nn.initializers.normal(0.5), causal=causal)
        params = layer.init(jax.random.PRNGKey(1), x, positions)
        first = [layer.apply(params, inputs, positions)[:, 0] for inputs in (x, later)]
        changed = not np.allclose(first[0], first[1], atol=1e-6)
        assert changed == (not causal), causal
