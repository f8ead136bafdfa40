"""Configuration checks and the analytic parameter count."""

from __future__ import annotations

import jax
import pytest
from transformer_helpers import TINY, random_ids, tiny

from pax_transformer import TransformerStack
from pax_transformer.models import TransformerLm, count_params

BAD = [
    ({"num_kv_heads": 3}, "num_kv_heads=3 must be a positive divisor of num_heads=4"),
    ({"num_kv_heads": 0}, "num_kv_heads=0"),
    ({"activation": "tanh"}, "activation='tanh' is not supported; valid values: 'relu', 'gelu'"),
    ({"norm": "batchnorm"}, "norm='batchnorm' is not supported; valid values: 'layernorm'"),
    ({"position": "alibi"}, "position='alibi' is not supported; valid values: 'rotary'"),
    ({"remat_policy": "SAVE_ALL"}, "remat_policy='SAVE_ALL' is not supported; valid values: "
                                   "None, 'SAVE_NOTHING'"),
    ({"dtype": "float16"}, "dtype='float16' is not supported"),
    ({"model_dims": 30}, "model_dims=30 is not divisible by num_heads=4"),
    ({"dim_per_head": 7}, "rotary positions need an even dim_per_head, got 7"),
    ({"num_layers": 0}, "num_layers must be a positive integer"),
    ({"dropout_rate": 1.0}, "dropout_rate must be in [0, 1)"),
    ({"attention_logit_cap": -1.0}, "attention_logit_cap must be 0 (off) or positive"),
    ({"init_std": 0.0}, "init_std must be positive or None"),
    ({"shared_norm": True}, "shared_norm (one norm feeding both branches) needs "
                            "parallel_residual=True"),
    ({"query_scale": 0.0}, "query_scale must be positive or None"),
    ({"norm_scale_offset": float("nan")}, "norm_scale_offset must be a finite number"),
    ({"rotary_fraction": 1.5}, "rotary_fraction must be in (0, 1], got 1.5"),
    ({"rotary_fraction": 0.1}, "rotary_fraction=0.1 of dim_per_head=8 rotates 0 dimensions"),
    ({"rotary_fraction": 0.375}, "rotates 3 dimensions; it must be an even number above 0"),
    ({"rotary_scaling": "yarn"}, "rotary_scaling='yarn' is not supported; valid values: "
                                 "'none', 'linear', 'llama3'"),
    ({"position": "learned", "rotary_scaling": "linear"},
     "rotary_scaling='linear' needs position='rotary'"),
    ({"rotary_scaling": "linear", "rotary_scaling_factor": 0.0},
     "rotary_scaling_factor must be positive"),
    ({"rotary_scaling": "llama3", "rotary_high_freq_factor": 1.0},
     "rotary_high_freq_factor=1.0 must exceed rotary_low_freq_factor=1.0"),
    ({"sliding_window": -1}, "sliding_window must be 0 (off) or a positive number of positions"),
    ({"global_every": 2}, "global_every=2 alternates sliding and global layers but "
                          "sliding_window is 0"),
    ({"local_rotary_base": 1e4}, "local_rotary_base is the rotary base of the sliding layers, "
                                 "but sliding_window is 0"),
    ({"sliding_window": 4, "global_every": 2, "stack": TransformerStack},
     "global_every (layers that differ: sliding or global) runs in pax-transformer's own "
     "layer stack only"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[str(o) for o, _ in BAD])
def test_bad_config_raises_a_clear_value_error(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        tiny(**overrides)
    assert message in str(error.value)
    with pytest.raises(ValueError):
        count_params(**{**TINY, **overrides})


def test_odd_heads_work_with_explicit_dim_per_head() -> None:
    assert tiny(model_dims=30, dim_per_head=8).head_dims == 8


COUNTED = [
    {},
    {"num_kv_heads": 2},
    {"num_kv_heads": 1, "gated": True, "activation": "silu", "norm": "rmsnorm"},
    {"tied_embedding": False},
    {"tied_embedding": False, "use_bias": True, "num_kv_heads": 2, "gated": True},
    {"position": "learned", "use_bias": True, "scan_layers": True},
    {"position": "sinusoidal", "scan_layers": True, "num_layers": 3, "dim_per_head": 6},
    {"qk_norm": True, "post_norms": True, "qkv_bias": True, "scan_layers": True},
    {"qk_norm": True, "norm": "rmsnorm", "parallel_residual": True, "shared_norm": True,
     "use_bias": True, "qkv_bias": True, "tied_embedding": False},
    {"use_bias": True, "tied_embedding": False, "head_bias": False, "parallel_residual": True},
    {"per_dim_scale": True, "ffn_bias": True, "head_bias": True, "position": "sinusoidal_rotary"},
    {"per_dim_scale": True, "ffn_bias": True, "head_bias": True, "tied_embedding": False,
     "scan_layers": True, "gated": True},
    {"use_bias": True, "ffn_bias": False},
]


@pytest.mark.parametrize("overrides", COUNTED, ids=[str(o) for o in COUNTED])
def test_count_params_matches_the_real_parameters(overrides: dict) -> None:
    fields = {**TINY, **overrides}
    shapes = jax.eval_shape(TransformerLm(**fields).init, jax.random.key(0), random_ids())
    real = sum(leaf.size for leaf in jax.tree.leaves(shapes["params"]))
    assert count_params(**fields) == real


def test_count_params_uses_the_model_defaults() -> None:
    # 2 layers of d=512, f=2048, tied vocab 32000 with layernorm: 12.5M weights.
    layer = 4 * 512 + 4 * 512 * 512 + 2 * 512 * 2048
    assert count_params() == 32000 * 512 + 2 * layer + 2 * 512
