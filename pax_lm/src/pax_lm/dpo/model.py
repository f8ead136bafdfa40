"""The DPO loss (Rafailov et al. 2023), against a frozen reference: the model it starts from.

A pair's answer has a log-probability under the model being tuned (the *policy*) and under the
*reference*: the sum over the answer's tokens of the log-softmax at its label. The implicit
reward of an answer is ``beta * (policy - reference)``, and the loss of a pair is ``-log
sigmoid(chosen reward - rejected reward)``, averaged over the batch's pairs.

The reference is the policy as it starts: an imported model, a fine-tuned job it warm-starts
from (``init_from``), or its own first weights. The model holds a frozen copy, the parameter
``reference``, of the decoder weights that train (``copied``, a regular expression over their
paths) and shares the rest, which must stay frozen: full fine-tuning copies every weight, and
with low-rank adapters only the adapters are copied (a fresh adapter's copy makes the reference
the base without adapters; adapters continued from a supervised job make it that job's model),
so the reference costs a copy of the adapters and no optimizer state. The copy starts as the
decoder's first weights; warm starts fill it from the source's decoder (``reference_rules``).
The reference runs without dropout and takes no gradient.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
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
# The warm-start rule that fills the reference's copy from the source's decoder weights.
REFERENCE_RULE = ("reference/(.*)", "decoder/{}")
# The reference's parameters, for the learner's bprop_variable_exclusion.
REFERENCE_WEIGHTS = "reference/.*"


class DpoLanguageModel(LanguageModel):
    """DPO over ``decoder`` (``ids -> logits``) at strength ``beta``, the reference holding a
    copy of the decoder weights whose paths ``copied`` matches (the weights that train).

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
    copied: str = ".*"

    def __post_init__(self) -> None:
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

    @nn.compact
    def log_probs(self, batch: dict[str, Any], train: bool = False
                  ) -> tuple[jax.Array, jax.Array]:
        """The answers' log-probabilities ``[batch, 2]`` under the policy and the reference."""
        pairs, rows, length = batch["ids"].shape
        ids, labels, weights = (batch[k].reshape(pairs * rows, length)
                                for k in ("ids", "labels", "weights"))
        policy = _answer_log_probs(self.decoder(ids, train=train), labels, weights)
        decoder, variables = self.decoder.unbind()
        copy = self.param("reference", lambda _: _select(variables["params"], self.copied))
        if self.is_initializing():  # the copy is the policy: no second pass to trace
            reference = jax.lax.stop_gradient(policy)
        else:
            frozen = jax.lax.stop_gradient({**variables,
                                            "params": _overlay(variables["params"], copy)})
            reference = _answer_log_probs(decoder.apply(frozen, ids, train=False), labels,
                                          weights)
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


def _select(params: Any, pattern: str, prefix: str = "") -> dict[str, Any]:
    """The leaves of ``params`` whose '/'-joined paths ``pattern`` matches, copied, nested as
    in ``params`` (a leaf's sharding annotation kept: the copy lies where the weight does)."""
    chosen: dict[str, Any] = {}
    for key, value in params.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            inner = _select(value, pattern, path + "/")
            if inner:
                chosen[key] = inner
        elif re.fullmatch(pattern, path):
            chosen[key] = jax.tree.map(jnp.copy, value)
    if not chosen and not prefix:
        raise UsageError(f"the DPO reference copies the decoder weights matching {pattern!r}, "
                         f"and none does")
    return chosen


def _overlay(params: Any, copy: dict[str, Any]) -> Any:
    """``params`` with the leaves ``copy`` holds replaced by its."""
    if not isinstance(copy, Mapping):
        return copy
    return {key: _overlay(value, copy[key]) if key in copy else value
            for key, value in params.items()}


def _answer_log_probs(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
    """Per row: the sum over the weighted positions of the log-softmax at the label."""
    xent = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return -jnp.sum(xent * weights, axis=-1)
