"""Low-rank adapters: a fresh adapter (B = 0) changes nothing, bitwise; folded into the kernels
they give the same logits as beside them, looped and scanned; dropout only in training; the
count of weights includes them; a target matching no projection is refused."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from transformer_helpers import random_ids

from pax_transformer import merge_adapter, stack_layer_params
from pax_transformer.models import TransformerLm, count_params

FIELDS = dict(vocab_size=32, num_layers=2, model_dims=16, hidden_dims=24, num_heads=2,
              max_seq_len=16, gated=True)
ADAPTED = dict(FIELDS, lora_rank=4, lora_alpha=8.0,
               lora_targets=("query", "value", "output", "gate", "down", "ffn/wi"))


def _init(model: TransformerLm, ids: jax.Array) -> dict:
    boxed = jax.jit(model.init)(jax.random.key(0), ids)["params"]
    return jax.tree.map(np.asarray, nn.unbox(boxed))


def _without_adapters(tree: dict) -> dict:
    return {k: _without_adapters(v) if isinstance(v, dict) else v for k, v in tree.items()
            if not k.startswith("lora_")}


def _trained_b(tree: dict, seed: int = 1) -> dict:
    """The adapters as after training: B drawn away from zero."""
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map_with_path(
        lambda path, w: rng.normal(0, 0.3, w.shape).astype(w.dtype)
        if path[-1].key == "lora_b" else w, tree)


def _merged(tree: dict, scale: float) -> dict:
    if "lora_a" in tree:
        kept = {k: v for k, v in tree.items() if not k.startswith("lora_")}
        return {**kept, "kernel": merge_adapter(tree["kernel"], tree["lora_a"], tree["lora_b"],
                                                scale)}
    return {k: _merged(v, scale) if isinstance(v, dict) else v for k, v in tree.items()}


def test_a_fresh_adapter_changes_nothing():
    ids = random_ids(length=8)
    params = _init(TransformerLm(**ADAPTED), ids)
    adapted = TransformerLm(**ADAPTED).apply({"params": params}, ids)
    base = TransformerLm(**FIELDS).apply({"params": _without_adapters(params)}, ids)
    np.testing.assert_array_equal(np.asarray(adapted), np.asarray(base))


@pytest.mark.parametrize("scan", [False, True], ids=["looped", "scanned"])
def test_merged_adapters_give_the_same_logits(scan):
    ids = random_ids(length=8)
    params = _trained_b(_init(TransformerLm(**ADAPTED), ids))
    if scan:
        params = {**params, "stack": stack_layer_params(params["stack"])}
    adapted_model = TransformerLm(**ADAPTED, scan_layers=scan)
    adapted = np.asarray(adapted_model.apply({"params": params}, ids))
    base = TransformerLm(**FIELDS, scan_layers=scan)
    merged = np.asarray(base.apply({"params": _merged(params, 8.0 / 4)}, ids))
    without = np.asarray(base.apply({"params": _without_adapters(params)}, ids))
    assert np.abs(adapted - without).max() > 0.1  # the adapters matter here
    np.testing.assert_allclose(merged, adapted, atol=1e-5, rtol=0)


def test_adapter_dropout_only_in_training():
    ids = random_ids(length=8)
    model = TransformerLm(**ADAPTED, lora_dropout=0.5)
    params = _trained_b(_init(model, ids))
    evaluated = [model.apply({"params": params}, ids) for _ in range(2)]
    np.testing.assert_array_equal(evaluated[0], evaluated[1])
    trained = [model.apply({"params": params}, ids, train=True,
                           rngs={"dropout": jax.random.key(seed)}) for seed in (0, 1)]
    assert float(jnp.abs(trained[0] - trained[1]).max()) > 1e-3


def test_the_weight_count_includes_the_adapters():
    ids = random_ids(length=8)
    params = _init(TransformerLm(**ADAPTED), ids)
    adapters = sum(w.size for path, w in jax.tree_util.tree_flatten_with_path(params)[0]
                   if path[-1].key.startswith("lora_"))
    # Per layer: query, value, output (16 -> 16) and gate, wi (16 -> 24), down (24 -> 16).
    assert adapters == 2 * 4 * (3 * (16 + 16) + 3 * (16 + 24))
    assert count_params(**ADAPTED) == sum(w.size for w in jax.tree.leaves(params))
    assert count_params(**ADAPTED) == count_params(**FIELDS) + adapters


@pytest.mark.parametrize(("fields", "message"), [
    (dict(FIELDS, gated=False, lora_rank=2, lora_targets=("gate",)),
     "lora target 'gate' matches no projection"),
    (dict(FIELDS, lora_rank=2, lora_targets=("attention/(",)), "is not a projection name"),
    (dict(FIELDS, lora_rank=2, lora_alpha=0.0), "lora alpha must be positive"),
    (dict(FIELDS, lora_rank=-1), "lora_rank must be 0"),
])
def test_bad_adapter_settings(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        TransformerLm(**fields)
