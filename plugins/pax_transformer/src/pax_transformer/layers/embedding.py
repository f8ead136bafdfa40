"""Token embedding and the output softmax (tied to the embedding or separate), with its bias.

The logits matmul accumulates in float32 (``preferred_element_type``) even when the compute dtype
is bfloat16, so that the logits the loss sees are float32 all the way; given labels, the head
gives their loss instead, computed a chunk of tokens at a time (``layers/cross_entropy.py``).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.typing import Initializer

from pax_core import axes
from pax_transformer.layers.cross_entropy import TokenLoss, cross_entropy, logits
from pax_transformer.layers.initializers import partitioned


class TokenEmbedding(nn.Module):
    """A [vocab_size, model_dims] table: ``__call__`` looks ids up, ``attend`` gives logits.

    ``scale`` multiplies looked-up vectors by sqrt(model_dims) (Pax's ``scale_sqrt_depth``);
    ``attend`` uses the unscaled table, as Pax's shared embedding-softmax does.
    """

    vocab_size: int
    model_dims: int
    init: Initializer
    scale: bool = True
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def setup(self) -> None:
        self.embedding = self.param(
            "embedding",
            partitioned(self.init, (axes.VOCAB, axes.EMBED)),
            (self.vocab_size, self.model_dims),
            self.param_dtype,
        )

    def __call__(self, ids: jax.Array) -> jax.Array:
        x = jnp.take(self.embedding, ids, axis=0).astype(self.dtype)
        return x * math.sqrt(self.model_dims) if self.scale else x

    def attend(self, x: jax.Array, labels: jax.Array | None = None,
               weights: jax.Array | None = None, bias: jax.Array | None = None,
               soft_cap: float = 0.0) -> jax.Array | TokenLoss:
        """x [..., model_dims] -> float32 logits [..., vocab_size] against the table (plus
        ``bias``, then soft-capped); with ``labels``, their ``TokenLoss`` instead
        (``layers/cross_entropy.py``: the logits are never held whole)."""
        return _head(x, self.embedding.T, bias, soft_cap, labels, weights)


class Softmax(nn.Module):
    """A separate (untied) output projection [model_dims, vocab_size], with optional bias:
    x -> float32 logits, soft-capped by ``soft_cap``; with ``labels``, their ``TokenLoss``
    instead (``layers/cross_entropy.py``: the logits are never held whole)."""

    vocab_size: int
    init: Initializer
    use_bias: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, labels: jax.Array | None = None,
                 weights: jax.Array | None = None, soft_cap: float = 0.0
                 ) -> jax.Array | TokenLoss:
        kernel = self.param(
            "kernel",
            partitioned(self.init, (axes.EMBED, axes.VOCAB)),
            (x.shape[-1], self.vocab_size),
            self.param_dtype,
        )
        bias = _vocab_bias(self, self.vocab_size, self.param_dtype) if self.use_bias else None
        return _head(x.astype(self.dtype), kernel, bias, soft_cap, labels, weights)


class LogitsBias(nn.Module):
    """The output bias [vocab_size] of a tied model, added to the logits against the embedding
    table (praxis's shared embedding-softmax has one; a separate ``Softmax`` holds its own)."""

    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, vocab_size: int) -> jax.Array:
        return _vocab_bias(self, vocab_size, self.param_dtype)


def _vocab_bias(module: nn.Module, vocab_size: int, param_dtype: Any) -> jax.Array:
    """``module``'s parameter ``bias`` [vocab] ("vocab"; zeros at the start)."""
    return module.param("bias", partitioned(nn.initializers.zeros, (axes.VOCAB,)),
                        (vocab_size,), param_dtype)


def _head(x: jax.Array, kernel: jax.Array, bias: jax.Array | None, soft_cap: float,
          labels: jax.Array | None, weights: jax.Array | None) -> jax.Array | TokenLoss:
    """The logits of ``x`` through ``kernel`` [model_dims, vocab] and ``bias``, or with
    ``labels`` their loss (every weight 1 where ``weights`` is None)."""
    if labels is None:
        return logits(x, kernel, bias, soft_cap)
    if weights is None:
        weights = jnp.ones(labels.shape, jnp.float32)
    return cross_entropy(x, kernel, labels, weights, bias=bias, soft_cap=soft_cap)
