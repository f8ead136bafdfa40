"""The image-classification task: a backbone, a linear classifier, softmax cross-entropy and
the metrics Pax's ClassificationModel reports.

Images cross from the input as ``uint8 [B, H, W, C]`` (a quarter of float32's bytes on the way
to the devices); the model scales them to [0, 1] and standardises them with ``mean`` and
``std`` per channel. ``weight`` per image leaves an eval batch's padding rows out of every
metric. Mixup (``mixup_alpha`` > 0) mixes each training image with its neighbour in the batch
by a Beta(alpha, alpha) ratio and the loss by the same ratio.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from pax_core import ModelOutput, UsageError, axes

FLOPS_FORMULA = "image-classifier-v1"


class ImageClassifier(nn.Module):
    """``backbone`` (features of float images, ``forward_flops``, ``feature_dims``) plus a
    ``num_classes``-way linear head, initialised N(0, ``head_init_std``) (Pax's softmax:
    0.01; 0: zeros, as ViT's head). ``image_size`` > 0 is the one size the model takes (the
    backbone's weights depend on it: Pax's CNN's dense layer, ViT's positions)."""

    backbone: Any
    num_classes: int
    image_size: int = 0
    channels: int = 0
    mean: tuple[float, ...] = (0.5,)
    std: tuple[float, ...] = (0.5,)
    head_init_std: float = 0.01
    label_smoothing: float = 0.0
    mixup_alpha: float = 0.0
    class_names: tuple[str, ...] = ()

    flops_formula = FLOPS_FORMULA

    @nn.nowrap
    def flops_per_step(self, batch_spec: dict[str, Any]) -> float:
        """Training FLOPs of a batch of images: 3 x (backbone forward + head) per image (the
        backward pass costs twice the forward)."""
        batch, height, width, channels = batch_spec["image"].shape
        head = 2.0 * self.backbone.feature_dims() * self.num_classes
        return 3.0 * batch * (self.backbone.forward_flops(height, width, channels) + head)

    @nn.nowrap
    def check_images(self, shape: tuple[int, ...]) -> None:
        """Refuse images the model was not built for, naming what to change."""
        _, height, width, channels = shape
        if self.image_size and (height, width) != (self.image_size, self.image_size):
            raise UsageError(f"the input's images are {height}x{width} but the model takes "
                             f"{self.image_size}x{self.image_size}; set the datasets' "
                             f"image_size (or the experiment's IMAGE_SIZE) to match")
        if self.channels and channels != self.channels:
            raise UsageError(f"the input's images have {channels} channels but the model "
                             f"takes {self.channels}; use images of {self.channels} channels")

    def __call__(self, batch: dict[str, Any], train: bool = False) -> ModelOutput:
        image, labels = batch["image"], batch["label"]
        weights = batch.get("weight")
        if weights is None:
            weights = jnp.ones(labels.shape, jnp.float32)
        x = self.standardise(image)
        ratio = None
        if train and self.mixup_alpha > 0:
            ratio = jax.random.beta(self.make_rng("dropout"), self.mixup_alpha, self.mixup_alpha)
            x = ratio * x + (1 - ratio) * jnp.roll(x, 1, axis=0)
        logits = self.classify(x, train)
        xent = self._xent(logits, labels)
        if ratio is not None:
            xent = ratio * xent + (1 - ratio) * self._xent(logits, jnp.roll(labels, 1))
        return ModelOutput(loss=jnp.sum(xent * weights) / jnp.maximum(jnp.sum(weights), 1.0),
                           metrics=classification_metrics(logits, labels, weights, xent))

    def predict(self, image: jax.Array) -> jax.Array:
        """Class probabilities ``[B, num_classes]`` of ``uint8 [B, H, W, C]`` images."""
        return jax.nn.softmax(self.classify(self.standardise(image), False), axis=-1)

    @nn.nowrap
    def standardise(self, image: jax.Array) -> jax.Array:
        """``uint8`` images as float32, scaled to [0, 1] and standardised per channel."""
        self.check_images(image.shape)
        x = (image.astype(jnp.float32) / 255.0 - jnp.asarray(self.mean)) / jnp.asarray(self.std)
        return nn.with_logical_constraint(x, (axes.BATCH, None, None, None))

    @nn.compact
    def classify(self, x: jax.Array, train: bool) -> jax.Array:
        """The logits ``[B, num_classes]`` (float32) of standardised images."""
        features = self.backbone(x, train)
        init = (nn.initializers.normal(self.head_init_std) if self.head_init_std > 0
                else nn.initializers.zeros)
        logits = nn.Dense(self.num_classes, name="head",
                          kernel_init=nn.with_logical_partitioning(init, (None, axes.CLASSES)),
                          bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                                 (axes.CLASSES,)))(features)
        return nn.with_logical_constraint(logits.astype(jnp.float32), (axes.BATCH, axes.CLASSES))

    def _xent(self, logits: jax.Array, labels: jax.Array) -> jax.Array:
        targets = jax.nn.one_hot(labels, self.num_classes)
        if self.label_smoothing:
            targets = optax.smooth_labels(targets, self.label_smoothing)
        return optax.softmax_cross_entropy(logits, targets)


def classification_metrics(logits: jax.Array, labels: jax.Array, weights: jax.Array,
                           xent: jax.Array) -> dict[str, tuple[Any, Any]]:
    """Pax's names: ``avg_xent``, ``accuracy``/``error`` (top-1), ``acc5``/``error5`` (top-5,
    with more than five classes) and ``num_predictions``."""
    top1 = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
    metrics = {"avg_xent": (xent, weights), "accuracy": (top1, weights),
               "error": (1.0 - top1, weights), "num_predictions": (jnp.sum(weights), None)}
    if logits.shape[-1] > 5:
        top5 = jnp.any(jax.lax.top_k(logits, 5)[1] == labels[:, None], axis=-1)
        metrics["acc5"] = (top5.astype(jnp.float32), weights)
        metrics["error5"] = (1.0 - top5.astype(jnp.float32), weights)
    return metrics
