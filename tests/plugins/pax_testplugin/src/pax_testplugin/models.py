"""A next-token model that sees the previous two tokens: enough to learn a stride."""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
import optax

from pax_core import ModelOutput


class TinyLm(nn.Module):
    vocab_size: int = 32
    dim: int = 32

    @nn.compact
    def __call__(self, batch, train: bool = False) -> ModelOutput:
        ids = batch["ids"]
        embed = nn.Embed(self.vocab_size, self.dim)
        current = embed(ids)
        previous = jnp.pad(current, ((0, 0), (1, 0), (0, 0)))[:, :-1]
        hidden = nn.relu(nn.Dense(4 * self.dim)(jnp.concatenate([current, previous], -1)))
        logits = nn.Dense(self.vocab_size)(hidden)
        weights = batch["weights"]
        xent = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
        correct = (jnp.argmax(logits, -1) == batch["labels"]).astype(jnp.float32)
        total = jnp.maximum(jnp.sum(weights), 1.0)
        return ModelOutput(
            loss=jnp.sum(xent * weights) / total,
            metrics={"accuracy": (correct, weights)},
            num_tokens=jnp.sum(weights),
        )
