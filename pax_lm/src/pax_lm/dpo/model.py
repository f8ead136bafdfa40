"""The DPO loss (Rafailov et al. 2023) over a decoder with low-rank adapters.

A pair's answer has a log-probability under the model being tuned (the *policy*: the decoder
with its adapters) and under the *reference* (the decoder without them: the base model the
adapters start from): the sum over the answer's tokens of the log-softmax at its label. The
implicit reward of an answer is ``beta * (policy - reference)``, and the loss of a pair is
``-log sigmoid(chosen reward - rejected reward)``, averaged over the batch's pairs.

The reference is the same decoder applied once more with every adapter's ``lora_b`` replaced by
zeros, which computes exactly the base model (a fresh adapter's ``lora_b`` is zero), under
``stop_gradient``: no frozen copy of the weights is held, and the reference stays the base
however long the adapters train. So DPO needs adapters (``LORA_RANK`` > 0). The reference runs
without dropout, as a fixed model should.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from pax_core import ModelOutput, UsageError
from pax_lm.models import LanguageModel
from pax_transformer import train_flops_per_token

# A forward pass costs a third of a training step's FLOPs (2 of the 6 per weight and token).
FORWARD_SHARE = 1 / 3


class DpoLanguageModel(LanguageModel):
    """DPO over ``decoder`` (``ids -> logits``, with adapters) at strength ``beta``.

    Takes ``pax_lm.dpo.preference_input``'s batch: ``ids``, ``labels`` and ``weights``, each
    ``[batch, 2, length]`` (a pair's chosen row, then its rejected one; weights 1 on the
    answer's tokens). Metrics, each weighted by pair (a padding pair, all weights 0, counts for
    nothing): ``loss``; ``chosen_reward`` and ``rejected_reward``, ``beta * (policy -
    reference)`` of each answer; ``reward_margin``, the chosen reward less the rejected one;
    ``preference_accuracy``, the fraction of pairs whose chosen reward is the higher; and
    ``num_pairs``, a count. ``num_tokens`` counts the answers' tokens of both rows, as
    ``LanguageModel`` counts the tokens it trains on. It is a ``LanguageModel``, so a tuned job
    decodes (``pax decode``) and exports as any LM job does.
    """

    beta: float = 0.1

    def __post_init__(self) -> None:
        if not getattr(self.decoder, "lora_rank", 0) > 0:
            raise UsageError("DPO needs LORA_RANK > 0 (the reference is the base without "
                             "adapters)")
        if not self.beta > 0:
            raise UsageError(f"DPO_BETA (beta) must be positive, got {self.beta}")
        super().__post_init__()

    @nn.nowrap
    def flops_per_step(self, batch_spec: dict[str, Any]) -> float:
        """Training FLOPs of a batch of ``ids [batch, 2, length]``: ``LanguageModel``'s count
        for both rows of every pair (the policy's forward and backward passes), plus the
        reference's forward pass over them."""
        batch, rows, length = batch_spec["ids"].shape
        tokens = batch * rows * length
        return tokens * train_flops_per_token(self.decoder, length) * (1 + FORWARD_SHARE)

    def log_probs(self, batch: dict[str, Any], train: bool = False
                  ) -> tuple[jax.Array, jax.Array]:
        """The answers' log-probabilities ``[batch, 2]`` under the policy and the reference."""
        pairs, rows, length = batch["ids"].shape
        ids, labels, weights = (batch[k].reshape(pairs * rows, length)
                                for k in ("ids", "labels", "weights"))
        policy = _answer_log_probs(self.decoder(ids, train=train), labels, weights)
        if self.is_initializing():  # the reference has no weights of its own
            reference = jax.lax.stop_gradient(policy)
        else:
            decoder, variables = self.decoder.unbind()
            base = jax.lax.stop_gradient({**variables,
                                          "params": without_adapters(variables["params"])})
            reference = _answer_log_probs(decoder.apply(base, ids, train=False), labels, weights)
        return policy.reshape(pairs, rows), reference.reshape(pairs, rows)

    def __call__(self, batch: dict[str, Any], train: bool = False) -> ModelOutput:
        policy, reference = self.log_probs(batch, train)
        rewards = self.beta * (policy - reference)
        chosen, rejected = rewards[:, 0], rewards[:, 1]
        margin = chosen - rejected
        losses = -jax.nn.log_sigmoid(margin)
        weights = batch["weights"]
        pair_weights = jnp.all(jnp.sum(weights, -1) > 0, -1).astype(jnp.float32)
        num_pairs = jnp.sum(pair_weights)
        return ModelOutput(
            loss=jnp.sum(losses * pair_weights) / jnp.maximum(num_pairs, 1.0),
            metrics={
                "loss": (losses, pair_weights),
                "reward_margin": (margin, pair_weights),
                "chosen_reward": (chosen, pair_weights),
                "rejected_reward": (rejected, pair_weights),
                "preference_accuracy": ((chosen > rejected).astype(jnp.float32), pair_weights),
                "num_pairs": (num_pairs, None),
            },
            num_tokens=jnp.sum(weights),
        )


def without_adapters(params: Any) -> Any:
    """``params`` with every adapter's ``lora_b`` zero: the base model's computation."""
    def zeroed(path: tuple[Any, ...], leaf: jax.Array) -> jax.Array:
        return jnp.zeros_like(leaf) if any(getattr(k, "key", None) == "lora_b"
                                           for k in path) else leaf
    return jax.tree_util.tree_map_with_path(zeroed, params)


def _answer_log_probs(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
    """Per row: the sum over the weighted positions of the log-softmax at the label."""
    xent = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return -jnp.sum(xent * weights, axis=-1)
