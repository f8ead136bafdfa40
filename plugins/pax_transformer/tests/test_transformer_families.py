"""The open decoder families as settings of ``TransformerLm``: each family's logits against a
numpy forward pass written from its formulas (``family_references.py``), looped and scanned,
with its exact parameter count; sliding windows under packing and decoding."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from family_references import Spec, gelu_tanh, gemma, gpt_neox, llama, phi, praxis, silu
from transformer_helpers import decoder, empty_cache, forward, init_params, random_ids

from pax_transformer import stack_layer_params
from pax_transformer.models import TransformerLm, count_params, train_flops_per_token

LENGTH = 10
SMALL = dict(vocab_size=32, model_dims=32, hidden_dims=48, num_heads=4, max_seq_len=16)
LLAMA = dict(SMALL, num_layers=2, num_kv_heads=2, norm="rmsnorm", norm_epsilon=1e-5,
             gated=True, activation="silu", scale_embedding=False, tied_embedding=False)
GEMMA = dict(SMALL, num_kv_heads=2, norm="rmsnorm", norm_scale_offset=1.0, post_norms=True,
             gated=True, activation="gelu_tanh", query_scale=0.3, sliding_window=3)
PARALLEL = dict(SMALL, num_layers=2, norm="layernorm", norm_epsilon=1e-5, use_bias=True,
                parallel_residual=True, scale_embedding=False, tied_embedding=False)
PRAXIS = dict(SMALL, num_layers=2, norm="layernorm", norm_scale_offset=1.0, per_dim_scale=True,
              ffn_bias=True, head_bias=True, attention_logit_cap=1.5, logits_soft_cap=2.0,
              norm_epsilon=1e-6)
# Llama 3.1 at positions in the thousands: with dim_per_head 8 and base 500000 the four
# wavelengths (6, 167, 4443, 118600) fall in the kept, kept, blended and divided bands.
LLAMA31_POSITIONS = np.stack([4000 + np.arange(LENGTH), 413 * np.arange(LENGTH)])


@dataclass(frozen=True)
class Family:
    fields: dict[str, Any]
    reference: Any
    spec: Spec
    positions: np.ndarray | None = None


def _spec(fields: dict[str, Any], **kwargs: Any) -> Spec:
    heads = fields["num_heads"]
    return Spec(num_layers=fields["num_layers"], num_heads=heads,
                num_kv_heads=fields.get("num_kv_heads") or heads,
                head_dim=fields["model_dims"] // heads, eps=fields["norm_epsilon"], **kwargs)


def _family(reference: Any, fields: dict[str, Any], positions: np.ndarray | None = None,
            **spec: Any) -> Family:
    return Family(fields, reference, _spec(fields, **spec), positions)


FAMILIES = {
    "qwen2": _family(llama, dict(LLAMA, qkv_bias=True, rotary_base=1e6), rope_theta=1e6,
                     qkv_bias=True),
    "qwen3": _family(llama, dict(LLAMA, qk_norm=True, rotary_base=1e6, tied_embedding=True),
                     rope_theta=1e6, qk_norm=True, tied=True),
    "mistral": _family(llama, dict(LLAMA, sliding_window=4), sliding_window=4),
    "llama3.1": _family(
        llama, dict(LLAMA, rotary_base=500000.0, rotary_scaling="llama3",
                    rotary_scaling_factor=8.0, rotary_low_freq_factor=1.0,
                    rotary_high_freq_factor=4.0, rotary_original_max_len=8192),
        LLAMA31_POSITIONS, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
    "gemma2": _family(
        gemma, dict(GEMMA, num_layers=2, global_every=2, attention_logit_cap=1.0,
                    logits_soft_cap=2.0, norm_epsilon=1e-6),
        sliding_window=3, sliding_pattern=2, query_scale=0.3, attn_softcap=1.0,
        final_softcap=2.0, tied=True),
    "gemma3": _family(
        gemma, dict(GEMMA, num_layers=7, global_every=6, qk_norm=True, rotary_base=1e6,
                    local_rotary_base=10000.0, rotary_scaling="linear",
                    rotary_scaling_factor=8.0, norm_epsilon=1e-6),
        sliding_window=3, sliding_pattern=6, query_scale=0.3, rope_theta=1e6,
        rope_local_theta=10000.0, rope_scaling={"rope_type": "linear", "factor": 8.0},
        qk_norm=True, tied=True),
    "gpt_neox": _family(gpt_neox, dict(PARALLEL, num_heads=2, activation="gelu",
                                       rotary_fraction=0.25), rotary_dims=4, bias=True),
    "praxis": _family(functools.partial(praxis, rotary=False, gated=False, act=gelu_tanh),
                      dict(PRAXIS, position="sinusoidal", activation="gelu_tanh"),
                      attn_softcap=1.5, final_softcap=2.0, tied=True),
    "praxis_rotary_gated": _family(
        functools.partial(praxis, rotary=True, gated=True, act=silu),
        dict(PRAXIS, position="sinusoidal_rotary", activation="silu", gated=True),
        attn_softcap=1.5, final_softcap=2.0, tied=True),
    "phi": _family(phi, dict(PARALLEL, shared_norm=True, activation="gelu_tanh",
                             rotary_fraction=0.5), rotary_dims=4, bias=True),
}


def _numpy(tree: Any) -> Any:
    return jax.tree.map(np.asarray, tree)


@pytest.mark.parametrize("name", FAMILIES)
def test_family_matches_its_reference_looped_and_scanned(name: str) -> None:
    family = FAMILIES[name]
    looped = TransformerLm(**family.fields)
    scanned = TransformerLm(**family.fields, scan_layers=True)
    ids = random_ids(length=LENGTH, seed=3)
    params = init_params(looped, ids)
    if looped.norm_scale_offset:  # Gemma stores scale - 1: draw that near 0, not near 1
        params = jax.tree_util.tree_map_with_path(
            lambda path, w: w - looped.norm_scale_offset if path[-1].key == "scale" else w,
            params)
    kwargs = {} if family.positions is None else {"positions": jnp.asarray(family.positions)}

    want = family.reference(_numpy(params), np.asarray(ids), family.spec, family.positions)
    got = forward(looped)(params, ids, **kwargs)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    stacked = {**params, "stack": stack_layer_params(params["stack"])}
    scanned_logits = forward(scanned)(stacked, ids, **kwargs)
    np.testing.assert_allclose(scanned_logits, want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(scanned_logits, got, atol=5e-6, rtol=0)

    real = sum(leaf.size for leaf in jax.tree.leaves(params))
    assert count_params(**family.fields) == real
    assert count_params(**family.fields, scan_layers=True) == real
    # 6 per weight a token multiplies (every one but the looked-up embedding table, plus the
    # tied head's), and the attention scores and weighted values of every layer.
    multiplied = real - (0 if looped.tied_embedding else looped.vocab_size * looped.model_dims)
    attention = 12 * looped.num_layers * looped.num_heads * looped.head_dims * LENGTH
    assert train_flops_per_token(looped, LENGTH) == 6 * multiplied + attention


def test_a_window_changes_what_a_token_sees_and_stays_in_its_segment() -> None:
    """Mistral-like: past the window the logits differ from full attention's; packed segments
    give what each segment gives alone (the window never reaches into an earlier segment)."""
    fields = FAMILIES["mistral"].fields
    model = TransformerLm(**fields)
    ids = random_ids(1, LENGTH, seed=4)
    params = init_params(model, ids)
    run = forward(model)
    windowed = run(params, ids)
    full = forward(TransformerLm(**{**fields, "sliding_window": 0}))(params, ids)
    window = fields["sliding_window"]
    np.testing.assert_allclose(windowed[:, :window], full[:, :window], atol=1e-5)
    assert not np.allclose(windowed[:, window:], full[:, window:], atol=1e-3)

    segments = jnp.asarray([[1] * 6 + [2] * 4])
    positions = jnp.asarray([list(range(6)) + list(range(4))])
    packed = run(params, ids, segment_ids=segments, positions=positions)
    np.testing.assert_allclose(packed[:, :6], run(params, ids[:, :6]), atol=1e-5)
    np.testing.assert_allclose(packed[:, 6:], run(params, ids[:, 6:]), atol=1e-5)


DECODED = dict(SMALL, num_layers=3, num_kv_heads=2, norm="rmsnorm", sliding_window=3,
               global_every=2, rotary_base=1e6, local_rotary_base=10000.0,
               rotary_scaling="linear", rotary_scaling_factor=4.0, attention_logit_cap=2.0)


@pytest.mark.parametrize("scan", [False, True], ids=["loop", "scan"])
def test_decoding_a_sliding_and_global_model_matches_the_full_forward(scan: bool) -> None:
    """Layers 0 and 2 slide over 3 positions, layer 1 is global with its own rotary; a
    3-token prompt then single tokens give the full forward's logits."""
    model = TransformerLm(**DECODED, scan_layers=scan)
    looped = TransformerLm(**DECODED)
    ids = random_ids(length=LENGTH, seed=5)
    params = init_params(looped, ids)
    if scan:
        params = {**params, "stack": stack_layer_params(params["stack"])}
    full = forward(model)(params, ids)
    step = decoder(model)
    logits, cache = step(params, empty_cache(model, ids), ids[:, :3])
    np.testing.assert_allclose(logits, full[:, :3], atol=1e-5)
    for t in range(3, LENGTH):
        logits, cache = step(params, cache, ids[:, t : t + 1])
        np.testing.assert_allclose(logits[:, 0], full[:, t], atol=1e-5)


def test_offset_norms_start_at_one_and_scale_by_offset_plus_weight() -> None:
    """With norm_scale_offset=1 a fresh model's scales are 0 (it multiplies by 1), and a model
    computes what the offset-free model computes with every scale raised by 1."""
    fields = dict(SMALL, num_layers=1, norm="rmsnorm", qk_norm=True, post_norms=True)
    offset = TransformerLm(**fields, norm_scale_offset=1.0)
    ids = random_ids(length=6)
    fresh = nn.unbox(jax.jit(offset.init)(jax.random.key(0), ids)["params"])
    scales = [leaf for path, leaf in jax.tree_util.tree_leaves_with_path(fresh)
              if path[-1].key == "scale"]
    assert len(scales) == 7  # attention, query, key, post-attention, ffn, post-ffn, final
    assert all(not np.asarray(scale).any() for scale in scales)

    params = init_params(offset, ids)
    raised = jax.tree_util.tree_map_with_path(
        lambda path, w: w + 1.0 if path[-1].key == "scale" else w, params)
    np.testing.assert_allclose(forward(offset)(params, ids),
                               forward(TransformerLm(**fields))(raised, ids), atol=1e-6)
