"""Shared helpers for the pax-transformer tests: a tiny float32 model and jitted calls."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from pax_transformer.models import TransformerLm

TINY: dict[str, Any] = dict(
    vocab_size=32, num_layers=2, model_dims=32, hidden_dims=64, num_heads=4, max_seq_len=16
)


def tiny(**overrides: Any) -> TransformerLm:
    """A 2-layer, d=32 model; ``overrides`` replace any field."""
    return TransformerLm(**{**TINY, **overrides})


def random_ids(batch: int = 2, length: int = 8, seed: int = 0, vocab: int = 32) -> jax.Array:
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, vocab, jnp.int32)


def init_params(model: TransformerLm, ids: jax.Array, seed: int = 0, std: float = 0.2) -> Any:
    """Plain float32 params of the model's shapes drawn with numpy: N(0, std), and norm scales
    1 + N(0, std). Much faster than compiling ``model.init`` for every configuration.
    """
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), ids)["params"])
    rng = np.random.default_rng(seed)

    def draw(path: tuple, shape: jax.ShapeDtypeStruct) -> jax.Array:
        value = rng.normal(0.0, std, shape.shape) + (path[-1].key == "scale")
        return jnp.asarray(value, shape.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


def empty_cache(model: TransformerLm, ids: jax.Array) -> Any:
    """The all-zero decoding cache for a batch shaped like ``ids``."""
    shapes = jax.eval_shape(lambda i: model.init(jax.random.key(0), i, decode=True), ids)
    return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["cache"])


def forward(model: TransformerLm) -> Any:
    """jit of (params, ids, **kwargs) -> logits."""

    @jax.jit
    def run(params: Any, ids: jax.Array, **kwargs: Any) -> jax.Array:
        return model.apply({"params": params}, ids, **kwargs)

    return run


def decoder(model: TransformerLm) -> Any:
    """jit of (params, cache, chunk, positions) -> (logits, cache): one decoding call."""

    @jax.jit
    def step(params: Any, cache: Any, chunk: jax.Array, positions: Any = None) -> Any:
        logits, updated = model.apply(
            {"params": params, "cache": cache}, chunk, positions=positions, decode=True,
            mutable=["cache"],
        )
        return logits, updated["cache"]

    return step


def loss_fn(model: TransformerLm) -> Any:
    """Mean next-token cross-entropy of (params, ids): a scalar to differentiate."""

    def loss(params: Any, ids: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, ids[:, :-1])
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1))

    return loss
