"""The LM as a function: causality, packing, scan == loop, dropout, dtypes, sharding names."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from transformer_helpers import forward, init_params, random_ids, tiny

from pax_core.testing import cpu_mesh
from pax_transformer import stack_layer_params

POSITIONS = ["rotary", "sinusoidal", "learned"]


@pytest.mark.parametrize("scan", [False, True], ids=["loop", "scan"])
@pytest.mark.parametrize("position", POSITIONS)
def test_future_tokens_never_change_earlier_outputs(position: str, scan: bool) -> None:
    length = 8
    model = tiny(position=position, scan_layers=scan)
    base = random_ids(1, length)
    # Row t keeps tokens 0..t and replaces every later token by a different one.
    noise = (base + 1 + random_ids(length, length, seed=1, vocab=31)) % 32
    keep = jnp.arange(length)[None, :] <= jnp.arange(length)[:, None]
    perturbed = jnp.where(keep, base, noise)
    params = init_params(model, base)
    run = forward(model)
    # The same batch shape for both runs, so that both compute with one compiled program.
    expected = np.asarray(run(params, jnp.repeat(base, length, axis=0)))
    got = np.asarray(run(params, perturbed))
    for t in range(length - 1):
        np.testing.assert_allclose(got[t, : t + 1], expected[t, : t + 1], atol=1e-6)
        assert not np.allclose(got[t, t + 1 :], expected[t, t + 1 :], atol=1e-3), t


@pytest.mark.parametrize("position", POSITIONS)
def test_packed_segments_do_not_see_each_other(position: str) -> None:
    model = tiny(position=position)
    ids = random_ids(1, 9)
    segment_ids = jnp.array([[1, 1, 1, 2, 2, 2, 3, 3, 3]])
    positions = jnp.array([[0, 1, 2, 0, 1, 2, 0, 1, 2]])
    params = init_params(model, ids)
    run = forward(model)
    packed = run(params, ids, segment_ids=segment_ids, positions=positions)
    for segment in range(3):
        span = slice(3 * segment, 3 * segment + 3)
        alone = run(params, ids[:, span])
        np.testing.assert_allclose(packed[:, span], alone, atol=1e-5)
    unpacked = run(params, ids, positions=positions)
    assert not np.allclose(unpacked[:, 3:6], packed[:, 3:6], atol=1e-3)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"num_kv_heads": 2, "gated": True, "activation": "silu", "norm": "rmsnorm",
          "use_bias": True, "tied_embedding": False, "position": "learned"}],
    ids=["default", "gqa-gated-bias-learned"],
)
def test_scanned_stack_equals_looped_stack(overrides: dict) -> None:
    ids = random_ids()
    looped = tiny(**overrides)
    scanned = tiny(scan_layers=True, **overrides)
    params = init_params(looped, ids)
    stacked = {**params, "stack": stack_layer_params(params["stack"])}
    scan_shapes = jax.eval_shape(scanned.init, jax.random.key(0), ids)["params"]
    assert jax.tree.map(jnp.shape, stacked) == jax.tree.map(jnp.shape, nn.unbox(scan_shapes))
    np.testing.assert_allclose(
        forward(scanned)(stacked, ids), forward(looped)(params, ids), atol=1e-6, rtol=1e-6
    )


def test_stack_layer_params_refuses_other_keys() -> None:
    with pytest.raises(ValueError, match="layer_0"):
        stack_layer_params({"layers": {}})


def test_dropout_only_in_training() -> None:
    model = tiny(dropout_rate=0.5)
    ids = random_ids()
    params = init_params(model, ids)
    run = forward(model)
    np.testing.assert_array_equal(run(params, ids), run(params, ids))
    one, two = (
        model.apply({"params": params}, ids, train=True, rngs={"dropout": jax.random.key(s)})
        for s in (1, 2)
    )
    assert not np.allclose(one, two)


def test_bfloat16_compute_keeps_float32_params_and_logits() -> None:
    ids = random_ids()
    model = tiny(dtype="bfloat16")
    variables = jax.jit(model.init)(jax.random.key(0), ids)
    assert {x.dtype for x in jax.tree.leaves(nn.unbox(variables))} == {jnp.dtype("float32")}
    logits = forward(model)(nn.unbox(variables["params"]), ids)
    reference = forward(tiny())(nn.unbox(variables["params"]), ids)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, reference, atol=0.1)


RULES = (
    ("batch", "data"),
    ("vocab", "model"),
    ("heads", "model"),
    ("mlp", "model"),
    ("embed", None),
    ("kv", None),
    ("length", None),
    ("layers", None),
)


@pytest.mark.parametrize("scan", [False, True], ids=["loop", "scan"])
def test_logical_axes_shard_under_a_mesh_and_change_nothing(scan: bool) -> None:
    ids = random_ids(batch=4)
    model = tiny(num_kv_heads=2, gated=True, scan_layers=scan)
    variables = jax.eval_shape(model.init, jax.random.key(0), ids)
    specs = nn.get_partition_spec(variables)["params"]
    layer = specs["stack"]["layers" if scan else "layer_0"]
    lead = ("layers",) if scan else ()
    assert specs["embedding"]["embedding"] == jax.sharding.PartitionSpec("vocab", "embed")
    assert layer["attention"]["key"]["kernel"] == jax.sharding.PartitionSpec(
        *lead, "embed", "heads", "kv"
    )
    assert layer["ffn"]["wi_gate"]["kernel"] == jax.sharding.PartitionSpec(*lead, "embed", "mlp")

    params = init_params(model, ids)
    expected = forward(model)(params, ids)
    mesh = cpu_mesh((4, 2), ("data", "model"))
    with jax.set_mesh(mesh), nn.logical_axis_rules(RULES):
        shardings = nn.logical_to_mesh_sharding(specs, mesh, RULES)
        sharded = jax.device_put(params, shardings)
        logits = forward(model)(sharded, jax.device_put(ids, NamedSharding(mesh, jax.P("data"))))
    assert logits.sharding.spec == jax.P("data", None, "model")
    kernel = sharded["stack"]["layers" if scan else "layer_0"]["ffn"]["wi"]["kernel"]
    assert kernel.sharding.spec == jax.P(*(None,) * len(lead), None, "model")
    np.testing.assert_allclose(logits, expected, atol=1e-5)
