"""Decoding with the KV cache gives what full forward passes give."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from transformer_helpers import decoder, empty_cache, forward, init_params, random_ids, tiny

PROMPT, LENGTH = 3, 8

CONFIGS = [
    {},
    {"scan_layers": True, "num_kv_heads": 2},
    {"num_kv_heads": 1, "position": "learned", "attention_logit_cap": 5.0},
    {"position": "sinusoidal", "remat_policy": "SAVE_NOTHING"},
]


@pytest.mark.parametrize("overrides", CONFIGS, ids=["mha", "scan-gqa", "mqa-learned-cap",
                                                    "sinusoidal-remat"])
def test_prefill_then_single_tokens_match_full_forward(overrides: dict) -> None:
    model = tiny(**overrides)
    ids = random_ids(length=LENGTH)
    params = init_params(model, ids)
    full = forward(model)(params, ids)

    cache = empty_cache(model, ids)
    layer = cache["stack"]["layers" if model.scan_layers else "layer_0"]["attention"]
    lead = (model.num_layers,) if model.scan_layers else ()
    assert layer["cached_key"].shape == (*lead, 2, 16, model.kv_heads, 8)  # [B, S, K, H]
    assert layer["cached_value"].shape == layer["cached_key"].shape

    step = decoder(model)
    logits, cache = step(params, cache, ids[:, :PROMPT])
    np.testing.assert_allclose(logits, full[:, :PROMPT], atol=1e-5)
    for t in range(PROMPT, LENGTH):
        logits, cache = step(params, cache, ids[:, t : t + 1])
        np.testing.assert_allclose(logits[:, 0], full[:, t], atol=1e-5)
    assert cache["index"] == LENGTH


def test_explicit_positions_in_decode_match_the_default() -> None:
    model = tiny()
    ids = random_ids(length=4)
    params = init_params(model, ids)
    step = decoder(model)
    cache = empty_cache(model, ids)
    default, _ = step(params, cache, ids)
    explicit, _ = step(params, cache, ids, jnp.broadcast_to(jnp.arange(4), ids.shape))
    np.testing.assert_allclose(default, explicit, atol=1e-6)


def test_greedy_decoding_with_the_cache_matches_full_forward_argmax() -> None:
    model = tiny()
    prompt = random_ids(length=PROMPT)
    params = init_params(model, prompt)
    run = forward(model)

    # Reference: re-run the whole (zero-padded) sequence each step; causality makes the padding
    # after position t irrelevant to the prediction at t.
    reference = jnp.zeros((2, LENGTH), jnp.int32).at[:, :PROMPT].set(prompt)
    for t in range(PROMPT, LENGTH):
        reference = reference.at[:, t].set(jnp.argmax(run(params, reference)[:, t - 1], -1))

    step = decoder(model)
    cache = empty_cache(model, prompt)
    logits, cache = step(params, cache, prompt)
    tokens = [prompt]
    for _ in range(PROMPT, LENGTH):
        tokens.append(jnp.argmax(logits[:, -1:], -1).astype(jnp.int32))
        logits, cache = step(params, cache, tokens[-1])
    np.testing.assert_array_equal(jnp.concatenate(tokens, axis=1), reference)


def test_init_with_decode_gives_params_and_an_empty_cache() -> None:
    model = tiny(max_seq_len=8)
    ids = random_ids()
    variables = model.init(jax.random.key(0), ids, decode=True)
    assert jax.tree.map(jnp.shape, nn.unbox(variables["params"])) == jax.tree.map(
        jnp.shape, nn.unbox(model.init(jax.random.key(0), ids)["params"])
    )
    cache = variables["cache"]
    assert cache["index"] == 0
    assert cache["stack"]["layer_1"]["attention"]["cached_key"].shape == (2, 8, 4, 8)
    assert not any(np.asarray(leaf).any() for leaf in jax.tree.leaves(cache))


def test_decode_refuses_segment_ids_and_overlong_chunks() -> None:
    model = tiny()
    ids = random_ids()
    with pytest.raises(ValueError, match="segment_ids"):
        model.init(jax.random.key(0), ids, segment_ids=jnp.ones_like(ids), decode=True)
    with pytest.raises(ValueError, match="max_seq_len=16"):
        empty_cache(model, random_ids(length=17))
