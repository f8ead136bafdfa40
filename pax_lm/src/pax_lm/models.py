"""The LM task: next-token cross-entropy over a decoder, with the metrics Pax reports."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from pax_core import ModelOutput
from pax_transformer import FLOPS_FORMULA_VERSION, count_active_params, train_flops_per_token


class LanguageModel(nn.Module):
    """Wraps a decoder (``ids -> logits``) into a model that computes its own loss.

    Per-token ``weights`` leave padding out of every metric; ``segment_ids`` and
    ``segment_pos`` reach the decoder so that packed documents stay apart. Metrics use Pax's
    names; ``log_pplx`` is the natural-log perplexity, i.e. the mean cross-entropy.

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
        logits, stats = self.decoder(batch["ids"], segment_ids=batch.get("segment_ids"),
                                     positions=batch.get("segment_pos"), train=train,
                                     with_stats=True)
        labels = batch["labels"]
        weights = batch.get("weights")
        if weights is None:
            weights = jnp.ones(labels.shape, jnp.float32)
        xent = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        num_predictions = jnp.sum(weights)
        avg_xent = jnp.sum(xent * weights) / jnp.maximum(num_predictions, 1.0)
        correct = (argmax(logits) == labels).astype(jnp.float32)
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


# The chunk of the vocabulary ``argmax`` takes each maximum over: a multiple of a vector
# register's lanes on every platform.
_ARGMAX_CHUNK = 128


def argmax(logits: jax.Array) -> jax.Array:
    """``jnp.argmax(logits, -1)``, the same index (the first of the largest, or the first NaN),
    found in two levels on a CPU: the maximum of each chunk of 128 logits, the first chunk
    holding the largest, and the first largest within it.

    Why: XLA:CPU runs an argmax over a whole vocabulary as a scalar loop, some thirty times
    slower than a maximum (37 against 1.1 ms on [8, 256, 8192] logits on two cores), which made
    the accuracy metric alone 2 to 3% of a 25M-parameter LM's train step; the two levels take
    7 ms there (25 against 143 ms on [2, 1024, 32000]). A vocabulary that is no multiple of 128
    takes the one-level argmax (padding it is a copy of the logits, slower than what it saves),
    as do logits holding a NaN (their sum is NaN: a diverged step), which XLA:CPU's maximum may
    pass over. Accelerators reduce an argmax as fast as a maximum, and their vocabulary may be
    split over devices, which the second level's gather would have to collect: they take the
    one-level argmax always."""
    logits, vocab = jax.lax.stop_gradient(logits), logits.shape[-1]
    if vocab <= _ARGMAX_CHUNK or vocab % _ARGMAX_CHUNK or jax.default_backend() != "cpu":
        return jnp.argmax(logits, -1)
    return jax.lax.cond(jnp.isnan(jnp.sum(logits)), lambda x: jnp.argmax(x, -1), _two_level,
                        logits)


def _two_level(logits: jax.Array) -> jax.Array:
    """``argmax`` of logits without a NaN, their vocabulary a multiple of the chunk."""
    split = logits.reshape(*logits.shape[:-1], -1, _ARGMAX_CHUNK)
    chunk = jnp.argmax(jnp.max(split, -1), -1)
    within = jnp.take_along_axis(split, chunk[..., None, None], -2)[..., 0, :]
    return chunk * _ARGMAX_CHUNK + jnp.argmax(within, -1)


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
