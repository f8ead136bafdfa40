"""The Mixture-of-Experts feed-forward: routing, capacity, dropless experts, sizes, and expert
parallelism over 8 fake devices equal to one device."""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from pax_core import UsageError, axes
from pax_core.testing import cpu_mesh
from pax_transformer import (
    MoeFeedForward,
    count_active_params,
    count_params,
    dense_init,
    train_flops_per_token,
)
from pax_transformer.models import TransformerLm

D, F, E = 8, 12, 4


def _part(**fields: Any) -> MoeFeedForward:
    return MoeFeedForward(**{"num_experts": E, "hidden_dims": F, "kernel_init": dense_init(0.3),
                             "activation": "silu", "gated": True, **fields})


def _run(part: MoeFeedForward, x: jax.Array) -> tuple[Any, jax.Array, dict[str, jax.Array]]:
    params = part.init(jax.random.key(1), x)["params"]
    out, stats = jax.jit(part.apply)({"params": params}, x)
    return nn.unbox(params), out, stats


def _x(groups: int = 3, size: int = 10, seed: int = 0) -> jax.Array:
    return jax.random.normal(jax.random.key(seed), (groups, size, D))


def _reference_routing(params: Any, x: np.ndarray, top_k: int, normalize: bool
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Experts [G, S, k] best first, their gates, the probabilities and the logits, in
    float64 numpy."""
    logits = np.einsum("gsd,de->gse", x, np.asarray(params["router"], np.float64))
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    experts = np.argsort(-probs, axis=-1, kind="stable")[..., :top_k]
    gates = np.take_along_axis(probs, experts, -1)
    if normalize:
        gates = gates / gates.sum(-1, keepdims=True)
    return experts, gates, probs, logits


def _every_expert(params: Any, x: np.ndarray) -> np.ndarray:
    """[G, S, E, d]: every expert (SwiGLU) on every token."""
    wi, gate, wo = (np.asarray(params[n], np.float64) for n in ("wi", "wi_gate", "wo"))
    up, g = np.einsum("gsd,edf->gsef", x, wi), np.einsum("gsd,edf->gsef", x, gate)
    hidden = g / (1 + np.exp(-g)) * up
    return np.einsum("gsef,efd->gsed", hidden, wo)


def _shared(params: Any, x: np.ndarray) -> np.ndarray:
    p = {n: np.asarray(params["shared"][n]["kernel"], np.float64) for n in ("wi", "wi_gate", "wo")}
    g = x @ p["wi_gate"]
    return (g / (1 + np.exp(-g)) * (x @ p["wi"])) @ p["wo"]


@pytest.mark.parametrize("top_k,normalize,shared", [(2, True, 0), (1, True, 0), (3, False, 2)],
                         ids=["top2", "top1", "top3-unnormalized-shared"])
def test_dropless_equals_every_expert_on_every_token_masked(top_k, normalize, shared):
    x = _x()
    params, out, stats = _run(_part(top_k=top_k, normalize_top_k=normalize,
                                    shared_experts=shared), x)
    x64 = np.asarray(x, np.float64)
    experts, gates, probs, logits = _reference_routing(params, x64, top_k, normalize)
    mask = np.zeros(probs.shape)  # [G, S, E]: each chosen expert's gate, 0 for the others
    np.put_along_axis(mask, experts, gates, -1)
    expected = np.einsum("gsed,gse->gsd", _every_expert(params, x64), mask)
    if shared:
        expected += _shared(params, x64)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    assert float(stats["dropped_fraction"]) == 0.0
    load = np.bincount(experts.reshape(-1), minlength=E) / experts.size
    np.testing.assert_allclose(stats["expert_load"], load, atol=1e-6)
    balance = E * np.sum(load * probs.reshape(-1, E).mean(0))
    z = np.mean(np.log(np.exp(logits).sum(-1)) ** 2)
    np.testing.assert_allclose(stats["load_balancing_loss"], balance, rtol=1e-5)
    np.testing.assert_allclose(stats["router_z_loss"], z, rtol=1e-5)
    np.testing.assert_allclose(stats["aux_loss"], 0.01 * balance, rtol=1e-5)


def test_capacity_drops_exactly_the_choices_a_reference_predicts():
    x, top_k, factor = _x(groups=4, size=12), 2, 1.0
    params, out, stats = _run(_part(top_k=top_k, capacity_factor=factor), x)
    x64 = np.asarray(x, np.float64)
    experts, gates, _, _ = _reference_routing(params, x64, top_k, True)
    slots = int(np.ceil(factor * 12 / E))
    kept = np.zeros(experts.shape, bool)
    for g in range(4):  # GShard's order: every token's first choice, then every second one
        taken = np.zeros(E, int)
        for choice in range(top_k):
            for s in range(12):
                e = experts[g, s, choice]
                if taken[e] < slots:
                    kept[g, s, choice], taken[e] = True, taken[e] + 1
    assert 0 < kept.sum() < kept.size  # some dropped, some kept: the rule is exercised
    mask = np.zeros((4, 12, E))
    for choice in range(top_k):
        np.put_along_axis(mask, experts[..., choice:choice + 1],
                          (gates * kept)[..., choice:choice + 1], -1)
    expected = np.einsum("gsed,gse->gsd", _every_expert(params, x64), mask)
    np.testing.assert_allclose(out, expected, atol=1e-5)
    np.testing.assert_allclose(stats["dropped_fraction"], 1 - kept.mean(), atol=1e-6)


def test_a_capacity_that_holds_every_choice_equals_dropless():
    x = _x()
    _, dropless, _ = _run(_part(), x)
    _, capacity, stats = _run(_part(capacity_factor=E), x)  # E: every expert takes all
    assert float(stats["dropped_fraction"]) == 0.0
    np.testing.assert_allclose(capacity, dropless, atol=1e-6)


MOE_LM = dict(vocab_size=32, num_layers=2, model_dims=16, hidden_dims=24, num_heads=2,
              max_seq_len=16, gated=True, activation="silu")


def _moe(top_k: int = 2, shared: int = 0, **fields: Any) -> dict[str, Any]:
    return {**MOE_LM, **fields, "feed_forward": functools.partial(
        MoeFeedForward, num_experts=E, top_k=top_k, shared_experts=shared)}


@pytest.mark.parametrize("scan", [False, True], ids=["loop", "scan"])
def test_the_counts_are_the_weights_initialised_and_the_flops_count_the_chosen_experts(scan):
    fields = _moe(shared=1, scan_layers=scan)
    model = TransformerLm(**fields)
    ids = jnp.zeros((2, 8), jnp.int32)
    params = jax.eval_shape(model.init, jax.random.key(0), ids)["params"]
    assert count_params(**fields) == sum(p.size for p in jax.tree.leaves(nn.unbox(params)))
    d, f, expert = 16, 24, 3 * 16 * 24
    unchosen = (E - 2) * expert
    assert count_active_params(model) == count_params(**fields) - 2 * unchosen
    # A dense model whose feed-forward is two experts and the shared one wide costs the same
    # per token, but for the router.
    dense = TransformerLm(**{**MOE_LM, "hidden_dims": 3 * f, "scan_layers": scan})
    router = 6 * 2 * d * E
    assert train_flops_per_token(model, 8) == train_flops_per_token(dense, 8) + router


def test_the_model_reports_each_sparse_layers_stats():
    model = TransformerLm(**_moe(scan_layers=True))
    ids = jnp.arange(16, dtype=jnp.int32).reshape(2, 8)
    variables = model.init(jax.random.key(0), ids)
    logits, stats = model.apply(variables, ids, with_stats=True)
    assert logits.shape == (2, 8, 32)
    assert stats["expert_load"].shape == (2, E) and stats["aux_loss"].shape == (2,)
    np.testing.assert_allclose(stats["expert_load"].sum(-1), 1.0, rtol=1e-6)
    _, dense_stats = TransformerLm(**MOE_LM).apply(
        TransformerLm(**MOE_LM).init(jax.random.key(0), ids), ids, with_stats=True)
    assert dense_stats == {}


@pytest.mark.parametrize("fields,message", [
    ({"top_k": 5}, "top_k=5 must be between 1 and num_experts=4"),
    ({"capacity_factor": 0.0}, "capacity_factor must be positive"),
    ({"capacity_factor": -1.0}, "capacity_factor must be positive"),
    ({"num_experts": 0}, "num_experts must be a positive integer"),
])
def test_a_bad_moe_setting_is_refused_when_the_model_is_made(fields, message):
    settings = {"num_experts": E, "top_k": 2, **fields}
    with pytest.raises(ValueError, match=message):
        TransformerLm(**{**MOE_LM, "feed_forward": functools.partial(MoeFeedForward,
                                                                     **settings)})


ALTERNATING = dict(_moe(), num_layers=5, moe_every=2, first_dense_layers=1, sliding_window=4,
                   global_every=2)


def test_alternating_layers_compute_the_same_looped_and_scanned():
    """Layer 0 dense (first_dense_layers), then dense and sparse by turns: the scanned stack's
    dense_layers and its groups of two hold the looped layers' weights."""
    ids = jax.random.randint(jax.random.key(2), (2, 8), 0, 32, jnp.int32)
    looped, scanned = (TransformerLm(**ALTERNATING, scan_layers=s) for s in (False, True))
    params = nn.unbox(looped.init(jax.random.key(0), ids)["params"])
    layers = params["stack"]

    def stacked(*names):
        return jax.tree.map(lambda *leaves: jnp.stack(leaves), *(layers[n] for n in names))

    as_scanned = {**params, "stack": {
        "dense_layers": stacked("layer_0"),
        "layers": {"block_0": stacked("layer_1", "layer_3"),
                   "block_1": stacked("layer_2", "layer_4")}}}
    shapes = nn.unbox(jax.eval_shape(scanned.init, jax.random.key(0), ids)["params"])
    assert jax.tree.map(jnp.shape, as_scanned) == jax.tree.map(jnp.shape, shapes)
    assert "router" in layers["layer_2"]["ffn"] and "router" not in layers["layer_1"]["ffn"]
    logits, stats = looped.apply({"params": params}, ids, with_stats=True)
    scanned_logits, scanned_stats = scanned.apply({"params": as_scanned}, ids, with_stats=True)
    np.testing.assert_allclose(scanned_logits, logits, atol=1e-5)
    assert stats["expert_load"].shape == (2, E)  # the two sparse layers
    np.testing.assert_allclose(scanned_stats["aux_loss"], stats["aux_loss"], rtol=1e-5)
    sparse_layers, expert = 2, 3 * 16 * 24  # an expert is as wide as the dense feed-forward
    weights = count_params(**ALTERNATING)
    assert weights == sum(p.size for p in jax.tree.leaves(params))
    all_dense = count_params(**{**MOE_LM, "num_layers": 5, "sliding_window": 4,
                                "global_every": 2})
    assert weights == all_dense + sparse_layers * (16 * E + (E - 1) * expert)
    assert count_active_params(looped) == weights - sparse_layers * (E - 2) * expert


@pytest.mark.parametrize("fields,message", [
    ({"moe_every": 2}, "must be a positive multiple of moe_every=2"),
    ({"first_dense_layers": 3}, "the 0 layers after first_dense_layers=3"),
    ({"moe_every": 0}, "moe_every must be a positive number"),
    ({"moe_every": 2, "feed_forward": None, "num_layers": 4}, "feed_forward is not set"),
])
def test_a_pattern_of_dense_and_sparse_layers_that_does_not_fit_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        TransformerLm(**{**_moe(), "num_layers": 3, **fields})


# Expert parallelism: the same training, on one device and split over 8.
BATCH, LENGTH, STEPS = 8, 8, 3


def _train(model: TransformerLm, mesh_shape: tuple[int, ...] | None) -> tuple[list, Any, str]:
    """``STEPS`` Adam steps on a fixed batch: the losses, the last gradients, and the compiled
    step's HLO; on one device (``mesh_shape`` None) or over ``EXPERT_MESH`` of that shape."""
    ids = jax.random.randint(jax.random.key(3), (BATCH, LENGTH + 1), 0, 32, jnp.int32)
    inputs, labels = ids[:, :-1], ids[:, 1:]
    variables = model.init(jax.random.key(0), inputs)
    params = nn.unbox(variables["params"])
    tx = optax.adam(1e-2)

    def loss_fn(p, inputs, labels):
        logits, stats = model.apply({"params": p}, inputs, with_stats=True)
        xent = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return xent + jnp.mean(stats["aux_loss"])

    def step(p, opt, inputs, labels):
        loss, grads = jax.value_and_grad(loss_fn)(p, inputs, labels)
        updates, opt = tx.update(grads, opt, p)
        return optax.apply_updates(p, updates), opt, loss, grads

    with contextlib.ExitStack() as placed:
        if mesh_shape is not None:
            mesh = cpu_mesh(mesh_shape, axes.EXPERT_MESH)
            placed.enter_context(jax.set_mesh(mesh))
            placed.enter_context(nn.logical_axis_rules(axes.EXPERT_RULES))
            params = jax.device_put(params, nn.logical_to_mesh_sharding(
                nn.get_partition_spec(variables)["params"], mesh, axes.EXPERT_RULES))
            batch = NamedSharding(mesh, PartitionSpec(("replica", "data", "expert")))
            inputs, labels = jax.device_put(inputs, batch), jax.device_put(labels, batch)
            wi = params["stack"]["layers"]["ffn"]["wi"]
            assert wi.sharding.spec[1] == "expert"  # [layers, experts, ...]: split as declared
        opt = tx.init(params)
        jitted = jax.jit(step)
        hlo = jitted.lower(params, opt, inputs, labels).as_text()
        losses = []
        for _ in range(STEPS):
            params, opt, loss, grads = jitted(params, opt, inputs, labels)
            losses.append(float(loss))
    return losses, jax.device_get(grads), hlo


def test_experts_split_over_an_axis_the_batch_is_not_split_over_is_a_usage_error():
    """Rules of one's own that split the experts but not the batch over the expert axis: one
    line saying what to map, before anything runs."""
    model = _parity_model(None)
    ids = jnp.zeros((BATCH, LENGTH), jnp.int32)
    rules = ((axes.BATCH, (axes.REPLICA, axes.DATA)),
             *(rule for rule in axes.EXPERT_RULES if rule[0] != axes.BATCH))
    mesh = cpu_mesh((1, 2, 4, 1), axes.EXPERT_MESH)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules), pytest.raises(
            UsageError, match="the batch is not; map 'batch' onto it too"):
        jax.eval_shape(model.init, jax.random.key(0), ids)


def _parity_model(capacity_factor: float | None) -> TransformerLm:
    return TransformerLm(**{**MOE_LM, "scan_layers": True, "feed_forward": functools.partial(
        MoeFeedForward, num_experts=E, top_k=2, capacity_factor=capacity_factor,
        z_loss_weight=1e-3)})


@functools.cache
def _on_one_device(capacity_factor: float | None) -> tuple[list, Any]:
    """The reference run, shared by the meshes compared with it."""
    losses, grads, _ = _train(_parity_model(capacity_factor), None)
    return losses, grads


@pytest.mark.parametrize("capacity_factor", [None, 1.5], ids=["dropless", "capacity"])
@pytest.mark.parametrize("mesh_shape", [(1, 2, 4, 1), (1, 2, 2, 2)],
                         ids=["expert4-data2", "expert2-mdl2-data2"])
def test_expert_parallelism_trains_as_one_device(mesh_shape, capacity_factor):
    single_losses, single_grads = _on_one_device(capacity_factor)
    losses, grads, hlo = _train(_parity_model(capacity_factor), mesh_shape)
    np.testing.assert_allclose(losses, single_losses, atol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), grads, single_grads)
    assert single_losses[-1] < single_losses[0]
    # The tokens really travel: all-to-all (capacity) or all-gather and reduce-scatter.
    moved = ("all_to_all",) if capacity_factor else ("all_gather", "reduce_scatter")
    for collective in moved:
        assert collective in hlo, collective
