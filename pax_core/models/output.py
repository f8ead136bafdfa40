"""What a model returns to the training loop.

A Pax model is a Flax ``linen.Module`` that computes its own loss, as in Pax: ``__call__(batch,
train=...)`` returns a ``ModelOutput``. The loop differentiates ``loss``; ``metrics`` are
weighted values (value, weight), so that averages over shards, microbatches and eval batches
weigh each example or token correctly; a weight of None marks a count, which is summed instead.

A model that also defines ``flops_per_step(batch_spec) -> float`` (training FLOPs of one global
batch, given its ``ShapeDtypeStruct``s) and ``flops_formula`` (the formula's name with a version,
``transformer-v1``) gets MFU in every run; see ``pax_core.speed.flops``. A sparse model (a
Mixture-of-Experts, whose tokens each go through a few of its experts) also defines
``active_params() -> int``, the weights one token multiplies, which ``pax plan`` prints beside
the total.
"""

from __future__ import annotations

from typing import Any, NamedTuple

WeightedScalar = tuple[Any, Any]


class ModelOutput(NamedTuple):
    """The loss to minimise, weighted metrics, and how many tokens the batch held.

    ``num_tokens`` feeds the tokens/s metric; leave it 0 for models without tokens.
    """

    loss: Any
    metrics: dict[str, WeightedScalar]
    num_tokens: Any = 0
