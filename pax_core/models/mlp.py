"""A dense classifier: the smallest real model, used by the core's example experiment."""

from __future__ import annotations

import itertools
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import optax

from pax_core.models.output import ModelOutput


class MlpClassifier(nn.Module):
    """ReLU MLP over ``batch["features"]`` predicting ``batch["labels"]`` with cross-entropy."""

    num_classes: int = 4
    hidden_dims: tuple[int, ...] = (64,)

    flops_formula = "dense-v1"

    @nn.nowrap
    def flops_per_step(self, batch_spec: dict[str, Any]) -> float:
        """6 x weights x examples: a weight costs 2 FLOPs forward and 4 backward (biases and
        activations are left out)."""
        examples, features = batch_spec["features"].shape
        widths = (features, *self.hidden_dims, self.num_classes)
        return 6.0 * examples * sum(a * b for a, b in itertools.pairwise(widths))

    @nn.compact
    def __call__(self, batch, train: bool = False) -> ModelOutput:
        x = batch["features"]
        for width in self.hidden_dims:
            x = nn.relu(nn.Dense(width)(x))
        logits = nn.Dense(self.num_classes)(x)
        labels = batch["labels"]
        xent = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        ones = jnp.ones_like(xent)
        correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
        return ModelOutput(
            loss=jnp.mean(xent),
            metrics={"accuracy": (correct, ones), "xent": (xent, ones)},
        )
