"""Token embedding and the output softmax (tied to the embedding or separate), with its bias.

The logits matmul accumulates in float32 (``preferred_element_type``) even when the compute dtype
is bfloat16, so that the logits the loss sees are float32 all the way.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.typing import Initializer

from pax_core import axes
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

    def attend(self, x: jax.Array) -> jax.Array:
        """x [..., model_dims] -> float32 logits [..., vocab_size] against the table."""
        table = self.embedding.astype(self.dtype)
        return jnp.einsum("...d,vd->...v", x, table, preferred_element_type=jnp.float32)


class Softmax(nn.Module):
    """A separate (untied) output projection [model_dims, vocab_size], with optional bias."""

    vocab_size: int
    init: Initializer
    use_bias: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        kernel = self.param(
            "kernel",
            partitioned(self.init, (axes.EMBED, axes.VOCAB)),
            (x.shape[-1], self.vocab_size),
            self.param_dtype,
        )
        logits = jnp.einsum(
            "...d,dv->...v", x, kernel.astype(self.dtype), preferred_element_type=jnp.float32
        )
        return _add_vocab_bias(self, logits, self.param_dtype) if self.use_bias else logits


class LogitsBias(nn.Module):
    """The output bias [vocab_size] of a tied model, added to the logits against the embedding
    table (praxis's shared embedding-softmax has one; a separate ``Softmax`` holds its own)."""

    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, logits: jax.Array) -> jax.Array:
        return _add_vocab_bias(self, logits, self.param_dtype)


def _add_vocab_bias(module: nn.Module, logits: jax.Array, param_dtype: Any) -> jax.Array:
    """``logits`` + ``module``'s parameter ``bias`` [vocab] ("vocab"; zeros at the start)."""
    bias = module.param("bias", partitioned(nn.initializers.zeros, (axes.VOCAB,)),
                        (logits.shape[-1],), param_dtype)
    return logits + bias.astype(jnp.float32)
