"""The LM task: next-token cross-entropy over a decoder, with the metrics Pax reports."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp

from pax_core import ModelOutput
from pax_transformer import FLOPS_FORMULA_VERSION, count_active_params, train_flops_per_token


class LanguageModel(nn.Module):
    """Wraps a decoder (``ids -> logits``; given ``labels`` and ``weights``, their
    ``pax_transformer.TokenLoss`` instead, as ``TransformerLm`` gives) into a model that
    computes its own loss.

    Per-token ``weights`` leave padding out of every metric; ``segment_ids`` and
    ``segment_pos`` reach the decoder so that packed documents stay apart. Metrics use Pax's
    names; ``log_pplx`` is the natural-log perplexity, i.e. the mean cross-entropy. The decoder
    computes the loss from its final hidden states a chunk of positions at a time (its
    ``labels``), never holding the float32 logits of the whole batch.

    A decoder with sparse (Mixture-of-Experts) layers adds their auxiliary losses, averaged
    over those layers, to the loss and to ``total_loss`` (as praxis adds ``aux_loss``), and
    reports them (``aux_loss``, ``load_balancing_loss``, ``router_z_loss``) with
    ``dropped_token_fraction`` (the token-choices dropped for capacity) and
    ``expert_load_max`` (the busiest expert's share of the choices times the number of
    experts: 1 when balanced), each averaged over the sparse layers.

    ``quantize_training="int8"`` computes the decoder's blocks' projections as int8 matmuls,
    forward and backward (``pax_lm.quantized_training``: the decoder is wrapped here, when the
    model is made, so its parameters, and the checkpoints holding them, stay the plain
    decoder's); None computes them in the decoder's dtype.
    """

    decoder: Any
    quantize_training: str | None = None

    flops_formula = f"transformer-v{FLOPS_FORMULA_VERSION}"

    def __post_init__(self) -> None:
        if self.quantize_training is not None:
            from pax_lm.quantized_training import for_training

            # Before Flax adopts the decoder as the submodule ``decoder``, which it then stays.
            object.__setattr__(self, "decoder",
                               for_training(self.decoder, self.quantize_training))
        super().__post_init__()

    @nn.nowrap
    def flops_per_step(self, batch_spec: dict[str, Any]) -> float:
        """Training FLOPs of a batch of ``ids [batch, length]`` (``pax_transformer.models``'s
        formula, per token, times the tokens)."""
        batch, length = batch_spec["ids"].shape
        return batch * length * train_flops_per_token(self.decoder, length)

    @nn.nowrap
    def active_params(self) -> int:
        """The weights one token multiplies (fewer than all for a sparse decoder)."""
        return count_active_params(self.decoder)

    def __call__(self, batch: dict[str, Any], train: bool = False) -> ModelOutput:
        labels = batch["labels"]
        weights = batch.get("weights")
        if weights is None:
            weights = jnp.ones(labels.shape, jnp.float32)
        loss, stats = self.decoder(batch["ids"], segment_ids=batch.get("segment_ids"),
                                   positions=batch.get("segment_pos"), train=train,
                                   with_stats=True, labels=labels, weights=weights)
        xent = loss.xent
        num_predictions = jnp.sum(weights)
        avg_xent = loss.weighted_sum / jnp.maximum(num_predictions, 1.0)
        correct = loss.correct.astype(jnp.float32)
        sparse = _sparse_metrics(stats)
        aux = sparse["aux_loss"][0] if sparse else 0.0
        return ModelOutput(
            loss=avg_xent + aux,
            metrics={
                **sparse,
                "total_loss": (xent + aux, weights),
                "avg_xent": (xent, weights),
                "log_pplx": (xent, weights),
                "fraction_of_correct_next_step_preds": (correct, weights),
                "num_predictions": (num_predictions, None),
            },
            num_tokens=num_predictions,
        )


def _sparse_metrics(stats: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The sparse layers' stats (each stacked over those layers) as metrics averaged over
    them; none for a dense decoder."""
    if not stats:
        return {}
    load = stats["expert_load"]  # [layers, experts]
    one = jnp.ones(())
    return {"aux_loss": (jnp.mean(stats["aux_loss"]), one),
            "load_balancing_loss": (jnp.mean(stats["load_balancing_loss"]), one),
            "router_z_loss": (jnp.mean(stats["router_z_loss"]), one),
            "dropped_token_fraction": (jnp.mean(stats["dropped_fraction"]), one),
            "expert_load_max": (jnp.mean(jnp.max(load, axis=-1)) * load.shape[-1], one)}
