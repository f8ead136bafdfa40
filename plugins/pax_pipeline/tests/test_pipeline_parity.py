"""A pipelined stack computes the unpipelined stack's function: the same loss and gradients
(float32, 1e-5) and the same training steps, for GPipe and circular schedules over 2 and 4
stages, with and without data/mdl sharding inside the stages, on 8 fake CPU devices."""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

from pax_core import axes
from pax_pipeline import Pipeline
from pax_pipeline.schedule import stored_shape
from pax_transformer import MoeFeedForward, TransformerLm

LAYERS = 8
MODEL = dict(vocab_size=64, num_layers=LAYERS, model_dims=32, hidden_dims=64, num_heads=4,
             max_seq_len=16, position="rotary", remat_policy="SAVE_NOTHING")
BATCH, LENGTH = 16, 8


def _batch(seed: int = 0) -> dict[str, jax.Array]:
    key = jax.random.PRNGKey(seed)
    ids = jax.random.randint(key, (BATCH, LENGTH + 1), 0, 64)
    # Two packed documents a row, so segments and positions travel through the stages.
    segments = jnp.where(jnp.arange(LENGTH) < 5, 1, 2) * jnp.ones((BATCH, 1), jnp.int32)
    positions = jnp.where(segments == 1, jnp.arange(LENGTH), jnp.arange(LENGTH) - 5)
    return {"ids": ids[:, :-1], "labels": ids[:, 1:], "segments": segments,
            "positions": positions}


def _loss_fn(model: TransformerLm):
    """The mean cross-entropy, plus the sparse layers' mean auxiliary loss if any."""
    def loss(params, batch):
        logits, stats = model.apply({"params": params}, batch["ids"],
                                    segment_ids=batch["segments"],
                                    positions=batch["positions"], train=True, with_stats=True)
        logp = jax.nn.log_softmax(logits)
        xent = -jnp.mean(jnp.take_along_axis(logp, batch["labels"][..., None], -1))
        return xent + (jnp.mean(stats["aux_loss"]) if stats else 0.0)

    return loss


@pytest.fixture(scope="module")
def reference():
    """The unpipelined (scanned) model on one device: its params, and 3 Adam steps."""
    model = TransformerLm(**MODEL, scan_layers=True)
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), _batch()["ids"])["params"])
    return params, _train(model, params)


def _train(model, params, steps: int = 3) -> tuple[list[float], dict]:
    """The losses of ``steps`` Adam steps, and the gradients of the first."""
    tx = optax.adam(1e-2)

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(_loss_fn(model))(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, grads

    opt_state, losses, first = tx.init(params), [], None
    for i in range(steps):
        params, opt_state, loss, grads = step(params, opt_state, _batch(i))
        losses.append(float(loss))
        first = grads if first is None else first
    return losses, first


def _stored(tree, pipeline: Pipeline, back: bool = False):
    """The unpipelined stack's weights in the pipeline's stored layout (or back)."""
    def convert(path, w):
        if "stack" not in jax.tree_util.keystr(path) or pipeline.circular_repeat == 1:
            return w
        if back:
            return w.reshape(-1, *w.shape[2:])
        return w.reshape(*stored_shape(LAYERS, pipeline), *w.shape[1:])

    return jax.tree_util.tree_map_with_path(convert, tree)


CASES = {
    "gpipe-2-stages": (Pipeline(num_stages=2, num_microbatches=4), (2, 1, 1, 1)),
    "gpipe-2-stages-data-mdl": (Pipeline(num_stages=2, num_microbatches=4), (2, 1, 2, 2)),
    "gpipe-4-stages-data": (Pipeline(num_stages=4, microbatch_size=2), (4, 1, 2, 1)),
    "circular-2-stages-data-mdl": (Pipeline(num_stages=2, num_microbatches=4,
                                            circular_repeat=2), (2, 1, 2, 2)),
    "circular-4-stages-mdl-stream-io": (Pipeline(num_stages=4, num_microbatches=4,
                                                 circular_repeat=2, stream_io=True),
                                        (4, 1, 1, 2)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_pipelined_stack_matches_the_unpipelined_one(case, reference):
    pipeline, shape = CASES[case]
    params, (want_losses, want_grads) = reference
    model = TransformerLm(**MODEL, stack=pipeline)
    shapes = jax.eval_shape(model.init, jax.random.PRNGKey(0), _batch()["ids"])["params"]
    stored = _stored(params, pipeline)
    assert jax.tree.map(lambda a: a.shape, nn.meta.unbox(shapes)) == \
        jax.tree.map(lambda a: a.shape, stored)
    devices = np.array(jax.devices()[:int(np.prod(shape))]).reshape(shape)
    with jax.set_mesh(Mesh(devices, axes.PIPELINE_MESH)), \
            nn.logical_axis_rules(axes.PIPELINE_RULES):
        losses, grads = _train(model, stored)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6),
                 _stored(grads, pipeline, back=True), want_grads)


def test_each_stage_holds_only_its_layers():
    """The stacked weights are split over the stage axis: device s holds stage s's rows."""
    pipeline = Pipeline(num_stages=4, num_microbatches=4)
    model = TransformerLm(**MODEL, stack=pipeline)
    boxed = jax.eval_shape(model.init, jax.random.PRNGKey(0), _batch()["ids"])["params"]
    spec = nn.get_partition_spec(boxed)["stack"]["layers"]["ffn"]["wi"]["kernel"]
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(4, 1, 1, 1), axes.PIPELINE_MESH)
    with nn.logical_axis_rules(axes.PIPELINE_RULES):
        mesh_spec = nn.logical_to_mesh_axes(spec)
    sharding = jax.sharding.NamedSharding(mesh, mesh_spec)
    assert mesh_spec[0] == axes.STAGE
    assert sharding.shard_shape((LAYERS, 32, 64)) == (LAYERS // 4, 32, 64)


def test_every_iteration_is_rematerialised_from_its_input(capsys):
    """With the layers' own remat off, the backward pass still keeps nothing from inside the
    stages: of the iteration loop's values only each iteration's stage inputs ([iterations,
    stages, microbatch, length, d]) and the small integer positions and segments are saved."""
    pipeline = Pipeline(num_stages=2, num_microbatches=4)
    model = TransformerLm(**{**MODEL, "remat_policy": None}, stack=pipeline)
    batch = _batch()
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), batch["ids"])["params"])
    jax.ad_checkpoint.print_saved_residuals(_loss_fn(model), params, batch)
    from_loop = [line.split(" ")[0] for line in capsys.readouterr().out.splitlines()
                 if "output of scan" in line and "schedule.py" in line]
    iterations = pipeline.iterations(4)
    assert sorted(from_loop) == sorted([f"f32[{iterations},2,4,{LENGTH},32]",
                                        f"i32[{iterations},2,4,{LENGTH}]",
                                        f"i32[{iterations},2,4,{LENGTH}]"]), from_loop


def test_bubble_iterations_touch_no_gradient():
    """Stage inputs of bubble iterations are zeros and their outputs are masked: a model whose
    stages would turn zeros into NaN (a norm without epsilon) still gets finite gradients."""
    pipeline = Pipeline(num_stages=4, num_microbatches=4)
    model = TransformerLm(**{**MODEL, "norm": "rmsnorm", "norm_epsilon": 1e-30}, stack=pipeline)
    batch = _batch()
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), batch["ids"])["params"])
    loss, grads = jax.jit(jax.value_and_grad(_loss_fn(model)))(params, batch)
    assert np.isfinite(float(loss))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))


@pytest.mark.parametrize("repeat", [1, 2])
def test_a_pipelined_model_decodes_with_its_own_weights(repeat):
    """Decoding runs the same weights as an unpipelined stack with a KV cache: a prefill gives
    the pipelined forward pass's logits, and the next token the full sequence's last logits."""
    model = TransformerLm(**MODEL, stack=Pipeline(num_stages=2, num_microbatches=2,
                                                  circular_repeat=repeat))
    ids = _batch()["ids"][:2]
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(0), ids)["params"])
    full = model.apply({"params": params}, ids)
    shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), ids, decode=True))
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["cache"])
    prefill, mutated = model.apply({"params": params, "cache": cache}, ids[:, :-1],
                                   decode=True, mutable=["cache"])
    last, _ = model.apply({"params": params, **mutated}, ids[:, -1:], decode=True,
                          mutable=["cache"])
    np.testing.assert_allclose(prefill, full[:, :-1], atol=1e-5)
    np.testing.assert_allclose(last[:, 0], full[:, -1], atol=1e-5)


# Mixture-of-Experts layers in the stages. The router z-loss is a mean over tokens, so a
# pipeline's average over its equal microbatches is the whole batch's; the load-balancing loss
# (a product of two means) is not, as with any microbatching, so it is weighed 0 here. Two
# steps, not three: the two programs round differently, and once the weights have moved twice
# that can flip a nearly tied top-2 choice, a jump no float tolerance describes (it did for the
# dropless stack, by 2.5e-4 of the third loss, when the machine code changed).
MOE_STEPS = 2
MOE = functools.partial(MoeFeedForward, num_experts=4, top_k=2, load_balancing_weight=0.0,
                        z_loss_weight=1e-2)


@functools.cache
def _moe_reference(capacity_factor: float | None):
    """The unpipelined (scanned) sparse model on one device, computed once for both schedules:
    its params, ``MOE_STEPS`` Adam steps (losses, first gradients) and the statistics of a
    forward pass."""
    moe = {**MODEL, "feed_forward": functools.partial(MOE, capacity_factor=capacity_factor)}
    unpipelined = TransformerLm(**moe, scan_layers=True)
    params = nn.meta.unbox(unpipelined.init(jax.random.PRNGKey(0), _batch()["ids"])["params"])
    losses, grads = _train(unpipelined, params, MOE_STEPS)
    _, stats = jax.jit(lambda p, b: unpipelined.apply(
        {"params": p}, b["ids"], segment_ids=b["segments"], positions=b["positions"],
        with_stats=True))(params, _batch())
    return moe, params, losses, grads, stats


@pytest.mark.parametrize("capacity_factor", [None, 1.5], ids=["dropless", "capacity"])
@pytest.mark.parametrize("pipeline", [Pipeline(num_stages=2, num_microbatches=4),
                                      Pipeline(num_stages=2, num_microbatches=4,
                                               circular_repeat=2)], ids=["gpipe", "circular"])
def test_pipeline_stages_of_moe_layers_match_the_unpipelined_stack(pipeline, capacity_factor):
    moe, params, want_losses, want_grads, want_stats = _moe_reference(capacity_factor)
    model = TransformerLm(**moe, stack=pipeline)
    devices = np.array(jax.devices()[:8]).reshape(2, 1, 2, 2)
    with jax.set_mesh(Mesh(devices, axes.PIPELINE_MESH)), \
            nn.logical_axis_rules(axes.PIPELINE_RULES):
        losses, grads = _train(model, _stored(params, pipeline), MOE_STEPS)
        _, stats = jax.jit(lambda p, b: model.apply(
            {"params": p}, b["ids"], segment_ids=b["segments"], positions=b["positions"],
            with_stats=True))(_stored(params, pipeline), _batch())
    np.testing.assert_allclose(losses, want_losses, rtol=1e-5)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6),
                 _stored(grads, pipeline, back=True), want_grads)
    # One entry per layer, in the layers' order: each layer's expert loads, averaged over the
    # microbatches, are those of the unpipelined stack up to the microbatching.
    assert stats["expert_load"].shape == (LAYERS, 4)
    np.testing.assert_allclose(stats["expert_load"], want_stats["expert_load"], rtol=1e-5)
    np.testing.assert_allclose(stats["router_z_loss"], want_stats["router_z_loss"], rtol=1e-5)
