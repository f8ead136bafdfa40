"""pax-vision's models: batch norm's statistics, the zero-initialised residual branch, mixup,
the image-size check, and the sizes and FLOPs of the ImageNet models."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_core import UsageError
from pax_transformer import BatchNorm
from pax_vision.layers.cnn import MnistCnn
from pax_vision.layers.resnet import ResidualBlock, ResNet
from pax_vision.layers.vit import VisionTransformer
from pax_vision.models import ImageClassifier


def _count(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


def test_batch_norm_trains_on_the_batch_and_evaluates_on_moving_averages():
    x = jax.random.normal(jax.random.PRNGKey(0), (16, 3)) * 3.0 + 2.0
    norm = BatchNorm()
    variables = nn.meta.unbox(norm.init(jax.random.PRNGKey(1), x, train=True))
    y, updated = norm.apply(variables, x, train=True, mutable=["batch_stats"])
    np.testing.assert_allclose(np.mean(y, 0), 0, atol=1e-5)
    np.testing.assert_allclose(np.var(y, 0), np.var(x, 0) / (np.var(x, 0) + 1e-3), rtol=1e-4)
    stats = nn.meta.unbox(updated["batch_stats"])
    np.testing.assert_allclose(stats["mean"], 0.1 * np.mean(x, 0), rtol=1e-5)
    np.testing.assert_allclose(stats["var"], 0.9 + 0.1 * np.var(x, 0), rtol=1e-5)
    evaluated = norm.apply({**variables, "batch_stats": stats}, x, train=False)
    expected = (x - stats["mean"]) / np.sqrt(stats["var"] + 1e-3)
    np.testing.assert_allclose(evaluated, expected, rtol=1e-5, atol=1e-5)


def test_residual_block_starts_as_the_identity():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 8, 16))
    for kind in ("basic", "bottleneck"):
        block = ResidualBlock(kind, channels=16, strides=1)
        variables = nn.meta.unbox(block.init(jax.random.PRNGKey(1), x, train=False))
        np.testing.assert_array_equal(block.apply(variables, x, train=False), jax.nn.relu(x))
        # Not so once the last norm's scale moves: the branch is live, only zeroed at init.
        last = "norm_1" if kind == "basic" else "norm_2"
        params = dict(variables["params"])
        params[last] = {**params[last], "scale": params[last]["scale"] + 1.0}
        moved = block.apply({**variables, "params": params}, x, train=False)
        assert not np.allclose(moved, jax.nn.relu(x))


def _classifier(**kw) -> ImageClassifier:
    return ImageClassifier(MnistCnn(channels=(4,), hidden_dims=8), num_classes=3,
                           image_size=8, channels=1, **kw)


def _batch():
    rng = np.random.default_rng(0)
    return {"image": rng.integers(0, 255, (4, 8, 8, 1), dtype=np.uint8),
            "label": np.array([0, 1, 2, 0], np.int32), "weight": np.ones(4, np.float32)}


def test_mixup_mixes_training_batches_only():
    plain, mixed = _classifier(), _classifier(mixup_alpha=0.4)
    batch = _batch()
    variables = plain.init(jax.random.PRNGKey(0), batch)
    rngs = {"dropout": jax.random.PRNGKey(3)}
    assert (float(mixed.apply(variables, batch, train=True, rngs=rngs).loss)
            != pytest.approx(float(plain.apply(variables, batch, train=True, rngs=rngs).loss)))
    assert (float(mixed.apply(variables, batch).loss)
            == pytest.approx(float(plain.apply(variables, batch).loss)))


def test_padding_rows_count_in_no_metric():
    model, batch = _classifier(), _batch()
    variables = model.init(jax.random.PRNGKey(0), batch)
    whole = model.apply(variables, {k: v[:2] for k, v in batch.items()})
    padded = model.apply(variables, {**batch, "weight": np.array([1, 1, 0, 0], np.float32)})
    assert float(padded.loss) == pytest.approx(float(whole.loss))
    _, weight = padded.metrics["accuracy"]
    assert float(jnp.sum(weight)) == 2


def test_images_of_another_size_are_refused():
    model = _classifier()
    batch = {**_batch(), "image": np.zeros((4, 16, 16, 1), np.uint8)}
    with pytest.raises(UsageError, match="images are 16x16 but the model takes 8x8"):
        model.init(jax.random.PRNGKey(0), batch)


@pytest.mark.parametrize(("backbone", "params", "gflops"), [
    (ResNet(depth=50), 25_557_032, 8.2),   # torchvision's ResNet-50 count; 4.1 GMACs
    (VisionTransformer(pooling="cls"), 86_567_656, 35.1),  # ViT-B/16 as timm; 17.6 GMACs
])
def test_imagenet_models_have_their_published_size(backbone, params, gflops):
    model = ImageClassifier(backbone, num_classes=1000, image_size=224, channels=3)
    batch = {"image": jax.ShapeDtypeStruct((1, 224, 224, 3), jnp.uint8),
             "label": jax.ShapeDtypeStruct((1,), jnp.int32)}
    variables = jax.eval_shape(lambda b: model.init(jax.random.PRNGKey(0), b), batch)
    assert _count(variables["params"]) == params
    assert backbone.forward_flops(224, 224, 3) / 1e9 == pytest.approx(gflops, rel=0.02)
    assert model.flops_per_step(batch) == pytest.approx(
        3 * (backbone.forward_flops(224, 224, 3) + 2 * backbone.feature_dims() * 1000))
