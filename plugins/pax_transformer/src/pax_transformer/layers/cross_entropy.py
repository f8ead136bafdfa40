"""The output projection's logits, and the next-token loss computed from it a chunk of tokens at
a time, so that a step never holds the [tokens, vocabulary] float32 logits.

Why: a 470M-weight model at 8 x 2,048 tokens and a 32,768 vocabulary makes 2 GiB of float32
logits, and their gradient as much again, a sixth of a 16 GiB chip. ``cross_entropy`` takes the
final hidden states and the projection instead of the logits, and computes each chunk's logits,
loss and the loss's gradients with respect to the hidden states, the projection and its bias in
one pass, when the loss is differentiated; its backward pass only scales them by the loss's
cotangent (the gradient of a sum of per-token losses is linear in that one scalar). Nothing is
computed twice: the three products of the logits are the same three the unchunked loss makes.
The chunks split the sequence (never the batch, which data parallelism splits over devices).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

# The float32 logits one chunk holds at most: the loss splits a sequence into chunks of
# positions so that a chunk's logits over the whole batch stay within this.
CHUNK_LOGITS_BYTES = 256 * 2**20


class TokenLoss(NamedTuple):
    """The loss of a batch of next-token predictions.

    ``weighted_sum``: the sum over tokens of weight x cross-entropy, the output gradients flow
    through. ``xent`` [batch, length] float32 and ``correct`` [batch, length] bool (whether the
    label's logit is the largest, a tie counting as correct) are for metrics: no gradient flows
    through them.
    """

    weighted_sum: jax.Array
    xent: jax.Array
    correct: jax.Array


def logits(x: jax.Array, kernel: jax.Array, bias: jax.Array | None = None,
           soft_cap: float = 0.0) -> jax.Array:
    """Hidden states [..., model_dims] -> float32 logits [..., vocab] through ``kernel``
    [model_dims, vocab], plus ``bias`` [vocab], then ``soft_cap * tanh(logits / soft_cap)``
    where ``soft_cap`` is set.

    The product runs in ``x``'s dtype and is written in it, as praxis's softmax and MaxText's
    computed it (the accumulation is float32 either way); the rest is float32. Written in
    bfloat16, a chunk's logits are half the bytes that the loss's passes over them read: on a
    v5e, 1 % of a 470M model's step."""
    out = jnp.einsum("...d,dv->...v", x, kernel.astype(x.dtype)).astype(jnp.float32)
    if bias is not None:
        out = out + bias.astype(jnp.float32)
    return soft_cap * jnp.tanh(out / soft_cap) if soft_cap else out


def cross_entropy(x: jax.Array, kernel: jax.Array, labels: jax.Array, weights: jax.Array, *,
                  bias: jax.Array | None = None, soft_cap: float = 0.0,
                  chunks: int | None = None) -> TokenLoss:
    """The next-token loss of hidden states ``x`` [batch, length, model_dims] against
    ``labels`` [batch, length] (int), each token weighted by ``weights`` [batch, length], through
    the logits ``logits(x, kernel, bias, soft_cap)``, a chunk of positions at a time.

    ``kernel`` [model_dims, vocab] may be the weights themselves (float32): the products run in
    ``x``'s dtype, and the kernel's gradient is summed over the chunks in float32 and returned
    in its own dtype.

    ``chunks`` splits the sequence into that many chunks (it must divide ``length``); None
    takes the fewest whose float32 logits stay within ``CHUNK_LOGITS_BYTES``.
    """
    batch, length, _ = x.shape
    chunks = chunks or loss_chunks(batch, length, kernel.shape[-1])
    if length % chunks:
        raise ValueError(f"chunks={chunks} does not divide the sequence length {length}")
    has_bias = bias is not None
    bias = bias if has_bias else jnp.zeros((), jnp.float32)
    weighted_sum, xent, correct = _loss(chunks, float(soft_cap), has_bias, x, kernel, bias,
                                        labels, weights.astype(jnp.float32))
    return TokenLoss(weighted_sum, jax.lax.stop_gradient(xent), jax.lax.stop_gradient(correct))


def loss_chunks(batch: int, length: int, vocab: int) -> int:
    """The fewest chunks of a sequence of ``length`` (a divisor of it) whose float32 logits
    over ``batch`` rows and ``vocab`` entries stay within ``CHUNK_LOGITS_BYTES`` (the whole
    sequence, one position a chunk, where even that is more)."""
    for chunks in range(1, length + 1):
        if length % chunks == 0 and batch * (length // chunks) * vocab * 4 <= CHUNK_LOGITS_BYTES:
            return chunks
    return length


class _Chunk(NamedTuple):
    """One chunk's inputs, [batch, chunk, ...]."""

    x: jax.Array
    labels: jax.Array
    weights: jax.Array


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _loss(chunks, soft_cap, has_bias, x, kernel, bias, labels, weights):
    """(weighted sum, xent, correct): the loss without its gradients (evaluation)."""
    kernel = kernel.astype(x.dtype)

    def chunk_loss(carry, part):
        found = _forward(part, kernel, bias if has_bias else None, soft_cap)
        return carry + found[0], found[1:3]

    total, (xent, correct) = _over_chunks(chunk_loss, jnp.zeros((), jnp.float32),
                                          _split(chunks, x, labels, weights))
    return total, _joined(xent), _joined(correct)


def _loss_fwd(chunks, soft_cap, has_bias, x, kernel, bias, labels, weights):
    """The loss and, chunk by chunk, its gradients for a cotangent of 1 (the residuals)."""
    # With symbolic zeros the inputs arrive wrapped, saying which are differentiated.
    wants_x, wants_kernel = x.perturbed, kernel.perturbed
    wants_bias = has_bias and bias.perturbed
    x, weights_dtype, bias = x.value, kernel.value.dtype, bias.value
    kernel = kernel.value.astype(x.dtype)
    labels, weights = labels.value, weights.value

    def chunk_step(carry, part):
        total, d_kernel, d_bias = carry
        weighted, xent, correct, d_logits = _forward(part, kernel, bias if has_bias else None,
                                                       soft_cap, gradient=True)
        if wants_bias:
            d_bias = d_bias + jnp.sum(d_logits, (0, 1))
        d_logits = d_logits.astype(kernel.dtype)
        if wants_kernel:
            d_kernel = d_kernel + jnp.einsum("bcd,bcv->dv", part.x, d_logits,
                                             preferred_element_type=jnp.float32)
        d_x = (jnp.einsum("bcv,dv->bcd", d_logits, kernel, preferred_element_type=jnp.float32)
               .astype(x.dtype) if wants_x else jnp.zeros((), x.dtype))
        return (total + weighted, d_kernel, d_bias), (xent, correct, d_x)

    start = (jnp.zeros((), jnp.float32),
             jnp.zeros(kernel.shape if wants_kernel else (), jnp.float32),
             jnp.zeros(bias.shape if wants_bias else (), jnp.float32))
    (total, d_kernel, d_bias), (xent, correct, d_x) = _over_chunks(
        chunk_step, start, _split(chunks, x, labels, weights))
    d_x = _joined(d_x) if wants_x else None
    residuals = (d_x, d_kernel.astype(weights_dtype) if wants_kernel else None,
                 d_bias.astype(bias.dtype) if wants_bias else None)
    return (total, _joined(xent), _joined(correct)), residuals


def _loss_bwd(chunks, soft_cap, has_bias, residuals, cotangents):
    """The gradients of the weighted sum: the forward pass's, times its cotangent. (``xent``
    and ``correct`` leave ``cross_entropy`` behind a stop_gradient: theirs are zero.)"""
    del chunks, soft_cap, has_bias
    scale = cotangents[0]
    if isinstance(scale, jax.custom_derivatives.SymbolicZero):  # the loss is not used
        residuals = (None,) * len(residuals)
    gradients = tuple(None if g is None else g * scale.astype(g.dtype) for g in residuals)
    return (*gradients, None, None)  # none for the labels and the weights


_loss.defvjp(_loss_fwd, _loss_bwd, symbolic_zeros=True)


def _forward(part: _Chunk, kernel: jax.Array, bias: jax.Array | None, soft_cap: float,
             gradient: bool = False) -> tuple:
    """One chunk's weighted loss sum, cross-entropy and whether each label's logit is the
    largest; with ``gradient``, also the gradient of the weighted sum with respect to the
    chunk's logits before the cap (float32).

    The accuracy metric compares the label's logit with the largest, which the normalizer needs
    anyway, rather than taking an argmax: an argmax is a reduction of its own (an index beside
    each maximum), 2.9 ms of a 470M model's step on a v5e and some thirty times a maximum's
    time on a CPU."""
    capped = logits(part.x, kernel, bias, soft_cap)
    top = jax.lax.stop_gradient(jnp.max(capped, -1, keepdims=True))
    log_norm = top[..., 0] + jnp.log(jnp.sum(jnp.exp(capped - top), -1))
    label_logit = jnp.take_along_axis(capped, part.labels[..., None], -1)[..., 0]
    xent = log_norm - label_logit
    found = (jnp.sum(xent * part.weights), xent, label_logit >= top[..., 0])
    if not gradient:
        return found
    probs = jnp.exp(capped - log_norm[..., None])
    one_hot = jax.nn.one_hot(part.labels, capped.shape[-1], dtype=jnp.float32)
    d_logits = (probs - one_hot) * part.weights[..., None]
    if soft_cap:
        d_logits = d_logits * (1.0 - jnp.square(capped / soft_cap))
    return (*found, d_logits)


def _split(chunks: int, x: jax.Array, labels: jax.Array, weights: jax.Array) -> _Chunk:
    """The inputs as [chunks, batch, chunk, ...]: each sequence cut into ``chunks`` pieces."""
    def cut(a: jax.Array) -> jax.Array:
        batch, length = a.shape[:2]
        return jnp.moveaxis(a.reshape(batch, chunks, length // chunks, *a.shape[2:]), 1, 0)

    return _Chunk(cut(x), cut(labels), cut(weights))


def _joined(a: jax.Array) -> jax.Array:
    """[chunks, batch, chunk, ...] back to [batch, length, ...]."""
    a = jnp.moveaxis(a, 0, 1)
    return a.reshape(a.shape[0], -1, *a.shape[3:])


def _over_chunks(step, carry, parts: _Chunk):
    """``jax.lax.scan`` of ``step`` over the chunks; one chunk is a plain call (no loop)."""
    if parts.x.shape[0] > 1:
        return jax.lax.scan(step, carry, parts)
    carry, out = step(carry, jax.tree.map(lambda a: a[0], parts))
    return carry, jax.tree.map(lambda a: a[None], out)
