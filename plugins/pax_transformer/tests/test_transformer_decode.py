"""Decoding with the KV cache gives what full forward passes give."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from transformer_helpers import decoder, empty_cache, forward, init_params, random_ids, tiny

from pax_transformer.layers.attention import Attention

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
    np.testing.assert_array_equal(cache["index"], [LENGTH, LENGTH])


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
    np.testing.assert_array_equal(cache["index"], [0, 0])  # one index per row
    assert cache["stack"]["layer_1"]["attention"]["cached_key"].shape == (2, 8, 4, 8)
    assert not any(np.asarray(leaf).any() for leaf in jax.tree.leaves(cache))


def test_decode_refuses_segment_ids_and_overlong_chunks() -> None:
    model = tiny()
    ids = random_ids()
    with pytest.raises(ValueError, match="segment_ids"):
        model.init(jax.random.key(0), ids, segment_ids=jnp.ones_like(ids), decode=True)
    with pytest.raises(ValueError, match="max_seq_len=16"):
        empty_cache(model, random_ids(length=17))


ROW_CONFIGS = [
    {},
    {"scan_layers": True, "num_kv_heads": 2, "sliding_window": 3, "global_every": 2,
     "local_rotary_base": 100.0},
    {"position": "learned", "sliding_window": 4},
    {"position": "sinusoidal", "num_kv_heads": 1},
]


@pytest.mark.parametrize("overrides", ROW_CONFIGS, ids=["rotary", "scan-window-global",
                                                        "learned-window", "sinusoidal-mqa"])
def test_rows_at_different_positions_decode_as_each_row_alone(overrides: dict) -> None:
    """Rows of different lengths in one batch, each from its own cache index: a right-padded
    prefill whose index is then set back to each row's length, then one token a row a call.
    Every row's logits are the ones it gets decoded on its own."""
    model = tiny(**overrides)
    lengths, steps = [2, 7, 4], 6
    ids = random_ids(batch=3, length=max(lengths) + steps, seed=1)
    params = init_params(model, ids[:, :4])
    step = decoder(model)

    alone = []
    for row, n in enumerate(lengths):
        cache = empty_cache(model, ids[row:row + 1, :1])
        logits, cache = step(params, cache, ids[row:row + 1, :n])
        row_logits = [logits[0, -1]]
        for t in range(n, n + steps):
            logits, cache = step(params, cache, ids[row:row + 1, t:t + 1])
            row_logits.append(logits[0, 0])
        alone.append(np.stack(row_logits))

    # Right-padded prompts in one call: the padding's keys land at and past each row's length,
    # where the mask hides them until the row's next tokens overwrite them.
    cache = empty_cache(model, ids[:, :1])
    padded = jnp.where(jnp.arange(max(lengths)) < jnp.asarray(lengths)[:, None],
                       ids[:, :max(lengths)], 0)
    logits, cache = step(params, cache, padded)
    cache = {**cache, "index": jnp.asarray(lengths, jnp.int32)}
    together = [logits[jnp.arange(3), jnp.asarray(lengths) - 1]]
    at = np.asarray(lengths)
    for _ in range(steps):
        logits, cache = step(params, cache, ids[jnp.arange(3), at][:, None])
        together.append(logits[:, 0])
        at = at + 1
    np.testing.assert_array_equal(cache["index"], np.asarray(lengths) + steps)
    together = np.stack(together, axis=1)
    for row in range(3):
        np.testing.assert_allclose(together[row], alone[row], atol=2e-5, rtol=1e-5)


def test_attention_takes_one_start_for_every_row_or_one_a_row() -> None:
    """A scalar ``decode_start`` (every row at one slot) writes and masks as the same start
    given per row does."""
    attention = Attention(num_heads=4, num_kv_heads=2, dim_per_head=8,
                          kernel_init=nn.initializers.normal(0.2), max_seq_len=8, decode=True)
    x = jax.random.normal(jax.random.key(0), (2, 3, 16))
    positions = jnp.broadcast_to(2 + jnp.arange(3), (2, 3))
    variables = attention.init(jax.random.key(1), x, positions, None, jnp.zeros((2,), jnp.int32))
    filled = jax.tree.map(lambda c: jax.random.normal(jax.random.key(2), c.shape),
                          variables["cache"])
    outputs = [attention.apply({"params": variables["params"], "cache": filled}, x, positions,
                               None, start, mutable=["cache"])
               for start in (jnp.int32(2), jnp.asarray([2, 2], jnp.int32))]
    (scalar, scalar_cache), (rows, rows_cache) = outputs
    np.testing.assert_array_equal(scalar, rows)
    jax.tree.map(np.testing.assert_array_equal, scalar_cache, rows_cache)
    # the new keys went to slots 2..4 of each row and nowhere else
    written = scalar_cache["cache"]["cached_key"] != filled["cached_key"]
    assert np.asarray(written).any(axis=(2, 3)).tolist() == [[0, 0, 1, 1, 1, 0, 0, 0]] * 2
