"""The next-token loss computed a chunk of positions at a time is the loss of the whole logits:
its value, its argmax and its gradients, and it never holds the logits whole."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest

from pax_transformer import TransformerLm, cross_entropy
from pax_transformer.layers.cross_entropy import CHUNK_LOGITS_BYTES, logits, loss_chunks

B, L, D, V = 2, 8, 16, 256


def _inputs(dtype=jnp.float32):
    k = jax.random.split(jax.random.key(0), 5)
    x = jax.random.normal(k[0], (B, L, D)).astype(dtype)
    kernel = jax.random.normal(k[1], (D, V)) * 0.3
    bias = jax.random.normal(k[2], (V,))
    labels = jax.random.randint(k[3], (B, L), 0, V)
    weights = (jax.random.uniform(k[4], (B, L)) > 0.3).astype(jnp.float32)
    return x, kernel, bias, labels, weights


def _whole(x, kernel, bias, labels, weights, soft_cap):
    """The loss as a user writes it: the whole logits, then optax's cross-entropy."""
    xent = optax.softmax_cross_entropy_with_integer_labels(
        logits(x, kernel, bias, soft_cap), labels)
    return jnp.sum(xent * weights)


@pytest.mark.parametrize("soft_cap", [0.0, 5.0])
@pytest.mark.parametrize("chunks", [1, 2, 4])
def test_value_accuracy_and_gradients_are_the_whole_logits(chunks, soft_cap):
    x, kernel, bias, labels, weights = _inputs()

    def chunked(x, kernel, bias):
        return cross_entropy(x, kernel, labels, weights, bias=bias, soft_cap=soft_cap,
                             chunks=chunks).weighted_sum

    want, want_grads = jax.value_and_grad(_whole, (0, 1, 2))(x, kernel, bias, labels, weights,
                                                              soft_cap)
    got, got_grads = jax.jit(jax.value_and_grad(chunked, (0, 1, 2)))(x, kernel, bias)
    assert got == pytest.approx(float(want), rel=1e-6)
    for g, w in zip(got_grads, want_grads, strict=True):
        assert jnp.allclose(g, w, rtol=1e-5, atol=1e-6)
    out = cross_entropy(x, kernel, labels, weights, bias=bias, soft_cap=soft_cap, chunks=chunks)
    whole = logits(x, kernel, bias, soft_cap)
    assert (out.correct == (jnp.argmax(whole, -1) == labels)).all()
    assert jnp.allclose(out.xent, optax.softmax_cross_entropy_with_integer_labels(whole, labels),
                        rtol=1e-6)


def test_gradients_scale_with_the_cotangent_and_only_the_differentiated_inputs_get_one():
    x, kernel, _, labels, weights = _inputs()
    want = jax.grad(lambda x: 3.0 * _whole(x, kernel, None, labels, weights, 0.0))(x)
    got = jax.grad(lambda x: 3.0 * cross_entropy(x, kernel, labels, weights,
                                                 chunks=4).weighted_sum)(x)
    assert jnp.allclose(got, want, rtol=1e-5, atol=1e-6)
    # A frozen projection (LoRA's head): no gradient is asked of it, and x's is the same.
    frozen = jax.jit(jax.grad(lambda x, k: cross_entropy(
        x, jax.lax.stop_gradient(k), labels, weights, chunks=2).weighted_sum))(x, kernel)
    assert jnp.allclose(frozen, want / 3.0, rtol=1e-5, atol=1e-6)
    # The metrics' cross-entropy carries no gradient: only the weighted sum does.
    metrics_only = jax.grad(lambda x: cross_entropy(x, kernel, labels, weights,
                                                    chunks=2).xent.sum())(x)
    assert not metrics_only.any()


def test_bfloat16_products_keep_float32_weight_gradients_close_to_the_whole_loss():
    x, kernel, bias, labels, weights = _inputs(jnp.bfloat16)
    got = jax.grad(lambda k: cross_entropy(x, k, labels, weights, bias=bias,
                                           chunks=4).weighted_sum)(kernel)
    want = jax.grad(lambda k: _whole(x.astype(jnp.float32), k, bias, labels, weights, 0.0))(
        kernel)
    assert got.dtype == jnp.float32
    assert float(jnp.max(jnp.abs(got - want))) < 0.02 * float(jnp.max(jnp.abs(want)))


def test_the_chunks_hold_a_fraction_of_the_whole_logits():
    batch, length, dims, vocab = 2, 256, 64, 16384
    whole_bytes = batch * length * vocab * 4
    x = jax.ShapeDtypeStruct((batch, length, dims), jnp.float32)
    kernel = jax.ShapeDtypeStruct((dims, vocab), jnp.float32)
    labels = jax.ShapeDtypeStruct((batch, length), jnp.int32)
    weights = jax.ShapeDtypeStruct((batch, length), jnp.float32)

    def temporaries(loss):
        step = jax.jit(jax.value_and_grad(loss, (0, 1)))
        return step.lower(x, kernel, labels, weights).compile().memory_analysis() \
            .temp_size_in_bytes

    whole = temporaries(lambda x, k, y, w: _whole(x, k, None, y, w, 0.0))
    chunked = temporaries(lambda x, k, y, w: cross_entropy(x, k, y, w, chunks=8).weighted_sum)
    assert whole >= whole_bytes
    assert chunked < whole_bytes / 2


def test_the_fewest_chunks_within_the_budget():
    per_position = 8 * 32768 * 4  # a batch of 8 over a 32,768 vocabulary, float32
    assert loss_chunks(8, 2048, 32768) == 2048 * per_position // CHUNK_LOGITS_BYTES
    assert loss_chunks(8, 256, 8192) == 1
    assert loss_chunks(1, 3, 10**9) == 3  # one position a chunk, even past the budget
    with pytest.raises(ValueError, match="does not divide the sequence length 8"):
        cross_entropy(*_inputs()[:2], *_inputs()[3:], chunks=3)


@pytest.mark.parametrize("tied", [True, False])
def test_the_decoder_with_labels_gives_the_loss_of_its_logits(tied):
    decoder = TransformerLm(vocab_size=V, num_layers=1, model_dims=D, hidden_dims=32,
                            num_heads=2, tied_embedding=tied, head_bias=True,
                            logits_soft_cap=4.0)
    ids = jax.random.randint(jax.random.key(1), (B, L), 0, V)
    _, _, _, labels, weights = _inputs()
    params = decoder.init(jax.random.key(2), ids)["params"]

    def by_logits(p):
        return _xent_sum(decoder.apply({"params": p}, ids), labels, weights)

    def by_labels(p):
        return decoder.apply({"params": p}, ids, labels=labels, weights=weights).weighted_sum

    want, want_grads = jax.value_and_grad(by_logits)(params)
    got, got_grads = jax.value_and_grad(by_labels)(params)
    assert got == pytest.approx(float(want), rel=1e-6)
    assert jax.tree.all(jax.tree.map(lambda g, w: jnp.allclose(g, w, rtol=1e-4, atol=1e-6),
                                     got_grads, want_grads))
    assert set(nn.unbox(params)["softmax"]) == ({"bias"} if tied else {"kernel", "bias"})


def _xent_sum(all_logits, labels, weights):
    return jnp.sum(optax.softmax_cross_entropy_with_integer_labels(all_logits, labels) * weights)
