"""The LM task: next-token cross-entropy over a decoder, with the metrics Pax reports."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import optax

from pax_core import ModelOutput
from pax_transformer import FLOPS_FORMULA_VERSION, train_flops_per_token


class LanguageModel(nn.Module):
    """Wraps a decoder (``ids -> logits``) into a model that computes its own loss.

    Per-token ``weights`` leave padding out of every metric; ``segment_ids`` and
    ``segment_pos`` reach the decoder so that packed documents stay apart. Metrics use Pax's
    names; ``log_pplx`` is the natural-log perplexity, i.e. the mean cross-entropy.
    """

    decoder: Any

    flops_formula = f"transformer-v{FLOPS_FORMULA_VERSION}"

    @nn.nowrap
    def flops_per_step(self, batch_spec: dict[str, Any]) -> float:
        """Training FLOPs of a batch of ``ids [batch, length]`` (``pax_transformer.models``'s
        formula, per token, times the tokens)."""
        batch, length = batch_spec["ids"].shape
        return batch * length * train_flops_per_token(self.decoder, length)

    def __call__(self, batch: dict[str, Any], train: bool = False) -> ModelOutput:
        logits = self.decoder(batch["ids"], segment_ids=batch.get("segment_ids"),
                              positions=batch.get("segment_pos"), train=train)
        labels = batch["labels"]
        weights = batch.get("weights")
        if weights is None:
            weights = jnp.ones(labels.shape, jnp.float32)
        xent = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        num_predictions = jnp.sum(weights)
        avg_xent = jnp.sum(xent * weights) / jnp.maximum(num_predictions, 1.0)
        correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
        return ModelOutput(
            loss=avg_xent,
            metrics={
                "total_loss": (xent, weights),
                "avg_xent": (xent, weights),
                "log_pplx": (xent, weights),
                "fraction_of_correct_next_step_preds": (correct, weights),
                "num_predictions": (num_predictions, None),
            },
            num_tokens=num_predictions,
        )
