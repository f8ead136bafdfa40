"""Mixtral in Pax: its published sizes (every weight and a token's, the experts split over an
expert axis), and the ``hf`` format's side of it that needs no transformers: the constants a
Mixtral ``config.json`` reads into and the configuration written back, the family a sparse or
dense model is exported as, and the routing Mixtral does not compute, refused by name. (The
weights and logits are checked against transformers itself in the ``hf`` session.)"""

from __future__ import annotations

import math
import re

import fiddle as fdl
import jax
import jax.numpy as jnp
import pytest

from pax_core import UsageError, axes
from pax_lm.experiments.base import ExpertParallel
from pax_lm.experiments.open_models import PUBLISHED, Mixtral8x7B, Mixtral8x22B, published
from pax_lm.experiments.open_weights import OpenWeightsLm
from pax_lm.hf.families import constants, model_type_of
from pax_transformer import MoeFeedForward, TransformerLm, count_active_params

TINY = dict(model_type="mixtral", vocab_size=64, hidden_size=32, intermediate_size=48,
            num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
            rms_norm_eps=1e-5, rope_theta=1000000.0, max_position_embeddings=4096,
            tie_word_embeddings=False, hidden_act="silu", num_local_experts=4,
            num_experts_per_tok=2, router_aux_loss_coef=0.02, router_jitter_noise=0.0,
            output_router_logits=False, sliding_window=None)
DENSE_KEYS = ("num_local_experts", "num_experts_per_tok", "router_aux_loss_coef",
              "router_jitter_noise", "output_router_logits")


def _decoder(cfg: dict, **overrides) -> TransformerLm:
    """The decoder ``pax import hf`` builds for ``cfg``, with constants ``overrides``."""
    exp = type("Imported", (OpenWeightsLm,), {**constants(cfg), **overrides})()
    return fdl.build(exp.decoder())


@pytest.mark.parametrize(("cls", "total", "active", "mesh"), [
    (Mixtral8x7B, 46_702_792_704, 12_879_925_248, [1, 8, 8, 1]),
    (Mixtral8x22B, 140_630_071_296, 39_161_468_928, [1, 16, 8, 1]),
])
def test_the_published_mixtrals_count_their_weights_and_split_their_experts(cls, total, active,
                                                                             mesh):
    exp = cls()
    decoder = fdl.build(exp.decoder())
    shapes = jax.eval_shape(lambda: decoder.init(jax.random.PRNGKey(0),
                                                 jnp.zeros((1, 8), jnp.int32)))
    assert sum(math.prod(x.shape) for x in jax.tree.leaves(shapes)) == total
    assert count_active_params(decoder) == active
    assert mesh == exp.ICI_MESH_SHAPE
    assert (exp.MESH_AXIS_NAMES, exp.LOGICAL_AXIS_RULES) == (axes.EXPERT_MESH, axes.EXPERT_RULES)
    assert exp.global_batch_size() == math.prod(mesh)
    assert exp.NUM_EXPERTS == 8 and decoder.scan_layers
    assert model_type_of(decoder)[1] == "mixtral"


def test_a_published_mesh_gives_every_mesh_axis_a_size():
    with pytest.raises(TypeError, match=r"^Wrong: the mesh \[1, 8, 1\] has 3 axes, its "
                                        r"MESH_AXIS_NAMES \['replica', 'data', 'expert', "
                                        r"'mdl'\] 4$"):
        @published("Mixtral8x7B", [1, 8, 1])
        class Wrong(ExpertParallel, OpenWeightsLm):
            pass


@pytest.mark.parametrize("cfg", [TINY, PUBLISHED["Mixtral8x7B"], PUBLISHED["Mixtral8x22B"]],
                         ids=["tiny", "8x7B", "8x22B"])
def test_a_mixtral_config_reads_into_its_routing_and_is_written_back(cfg):
    read = constants(cfg)
    top_k = cfg["num_experts_per_tok"]
    assert {key: read[key] for key in ("NUM_EXPERTS", "NUM_EXPERTS_PER_TOKEN", "MOE_HIDDEN_DIMS",
                                       "EXPERT_CAPACITY_FACTOR", "NUM_SHARED_EXPERTS",
                                       "NORMALIZE_EXPERT_WEIGHTS", "MOE_EVERY",
                                       "FIRST_DENSE_LAYERS")} == {
        "NUM_EXPERTS": cfg["num_local_experts"], "NUM_EXPERTS_PER_TOKEN": top_k,
        "MOE_HIDDEN_DIMS": cfg["intermediate_size"], "EXPERT_CAPACITY_FACTOR": None,
        "NUM_SHARED_EXPERTS": 0, "NORMALIZE_EXPERT_WEIGHTS": True, "MOE_EVERY": 1,
        "FIRST_DENSE_LAYERS": 0}
    # Hugging Face's load-balancing loss is top_k times Pax's.
    assert read["MOE_LOAD_BALANCING_WEIGHT"] == cfg["router_aux_loss_coef"] * top_k
    family, model_type = model_type_of(_decoder(cfg))
    assert (family.name, model_type) == ("Mixtral", "mixtral")
    written = family.write(_decoder(cfg))
    # The published entries come back, but the length Pax does not hold (transformers' own).
    assert {key: written[key] for key in cfg if key not in ("model_type",
                                                            "max_position_embeddings")} == {
        key: value for key, value in cfg.items() if key not in ("model_type",
                                                                "max_position_embeddings")}


def test_a_sliding_window_comes_in_and_goes_out():
    decoder = _decoder({**TINY, "sliding_window": 16})
    assert (decoder.sliding_window, decoder.global_every) == (16, 0)
    family, _ = model_type_of(decoder)
    assert family.write(decoder)["sliding_window"] == 16


def test_a_dense_family_never_claims_a_sparse_model_nor_mixtral_a_dense_one():
    llama = {key: value for key, value in TINY.items() if key not in DENSE_KEYS}
    llama.update(model_type="llama")
    mistral = {**llama, "model_type": "mistral", "sliding_window": 16}
    assert model_type_of(_decoder(llama))[1] == "llama"
    assert model_type_of(_decoder(mistral))[1] == "mistral"
    # Made sparse, either is a Mixtral (the window too); a Mixtral made dense, a Llama.
    assert model_type_of(_decoder(llama, NUM_EXPERTS=4))[1] == "mixtral"
    sparse_mistral = _decoder(mistral, NUM_EXPERTS=4)
    family, model_type = model_type_of(sparse_mistral)
    assert model_type == "mixtral" and family.write(sparse_mistral)["sliding_window"] == 16
    assert model_type_of(_decoder(TINY, NUM_EXPERTS=0))[1] == "llama"


def test_a_sparse_model_of_no_sparse_family_is_refused():
    gpt2 = dict(model_type="gpt2", vocab_size=64, n_embd=32, n_layer=2, n_head=4,
                n_positions=64, activation_function="gelu_new")
    with pytest.raises(UsageError, match=r"^this model's architecture matches none of the "
                                         r"sparse Hugging Face families Pax exports "
                                         r"\(Mixtral\)$"):
        model_type_of(_decoder(gpt2, NUM_EXPERTS=4))


@pytest.mark.parametrize(("overrides", "named"), [
    ({"EXPERT_CAPACITY_FACTOR": 1.25}, "EXPERT_CAPACITY_FACTOR=1.25 (Mixtral: None)"),
    ({"NUM_SHARED_EXPERTS": 1}, "NUM_SHARED_EXPERTS=1 (Mixtral: 0)"),
    ({"NORMALIZE_EXPERT_WEIGHTS": False}, "NORMALIZE_EXPERT_WEIGHTS=False (Mixtral: True)"),
    ({"MOE_EVERY": 3}, "MOE_EVERY=3 (Mixtral: 1)"),
    ({"FIRST_DENSE_LAYERS": 1}, "FIRST_DENSE_LAYERS=1 (Mixtral: 0)"),
    ({"FIRST_DENSE_LAYERS": 1, "MOE_EVERY": 2, "EXPERT_CAPACITY_FACTOR": 2.0},
     "EXPERT_CAPACITY_FACTOR=2.0 (Mixtral: None), MOE_EVERY=2 (Mixtral: 1), "
     "FIRST_DENSE_LAYERS=1 (Mixtral: 0)"),
])
def test_routing_mixtral_does_not_compute_is_refused_by_name(overrides, named):
    with pytest.raises(UsageError) as raised:
        model_type_of(_decoder(TINY, **overrides))
    assert str(raised.value) == (f"this model's Mixture-of-Experts settings are not "
                                 f"Mixtral's: {named}; it exports as Pax's own format (pax "
                                 f"export without --format)")


def test_experts_without_a_gate_are_refused_though_the_dense_layers_have_one():
    decoder = _decoder(TINY)
    plain = decoder.clone(feed_forward=fdl.build(fdl.Partial(MoeFeedForward, num_experts=4,
                                                             gated=False)))
    with pytest.raises(UsageError, match=r"not Mixtral's: experts without a gate \(Mixtral's "
                                         r"are gated\);"):
        model_type_of(plain)


@pytest.mark.parametrize(("change", "named"), [
    ({"router_jitter_noise": 0.01}, "router_jitter_noise=0.01 is not supported"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok=5 must be between 1 and "
                                 "num_local_experts=4"),
    ({"num_local_experts": None}, "config.json has no 'num_local_experts'"),
])
def test_a_mixtral_config_pax_does_not_compute_is_refused_by_name(change, named):
    with pytest.raises(UsageError, match=re.escape(named)) as raised:
        constants({**TINY, **change})
    assert "\n" not in str(raised.value)
