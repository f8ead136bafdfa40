"""Numpy forward passes of the open decoder families, written from their published formulas
(Hugging Face transformers' modeling code for each), for the family tests to hold
``TransformerLm`` against. They read a looped ``TransformerLm``'s weights by name (the layout
the import maps onto) and compute in float64, except the rotary angles, which are computed as
those implementations compute them: float32 inverse frequencies times float32 positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Spec:
    """What a reference needs beside the weights; defaults are Llama's."""

    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float
    rope_theta: float = 10000.0
    rotary_dims: int | None = None  # None: head_dim
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    sliding_window: int | None = None
    sliding_pattern: int = 0  # Gemma: layer i is global when (i + 1) % pattern == 0
    rope_local_theta: float | None = None
    query_scale: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    qkv_bias: bool = False  # Qwen 2: biases on q, k, v only
    bias: bool = False  # GPT-NeoX, Phi: a bias on every projection, the head's included
    qk_norm: bool = False  # Qwen 3, Gemma 3
    tied: bool = False  # the head is the embedding's transpose


# ---------------------------------------------------------------- norms, activations, rope


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Llama / Qwen / Mistral: ``w * x / sqrt(mean(x^2) + eps)``."""
    return weight * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def gemma_rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """Gemma stores ``w - 1``: ``x / sqrt(mean(x^2) + eps) * (1 + w)``."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + weight)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    centred = x - x.mean(-1, keepdims=True)
    return centred / np.sqrt(np.mean(centred**2, -1, keepdims=True) + eps) * weight + bias


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def gelu(x: np.ndarray) -> np.ndarray:
    """The exact (erf) GELU."""
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GPT-2's ``gelu_new`` / ``gelu_pytorch_tanh``."""
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def default_inv_freq(dim: int, theta: float) -> np.ndarray:
    """``1 / theta**(arange(0, dim, 2) / dim)`` in float32."""
    exponent = np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)
    return np.float32(1.0) / np.power(np.float32(theta), exponent)


def scaled_inv_freq(inv_freq: np.ndarray, scaling: dict[str, Any]) -> np.ndarray:
    """The rope types "linear" and "llama3" (Llama 3.1), from their definitions in float64."""
    kind = scaling.get("rope_type", "default")
    if kind == "default":
        return inv_freq
    factor = scaling["factor"]
    if kind == "linear":
        return (inv_freq / np.float32(factor)).astype(np.float32)
    assert kind == "llama3", kind
    freq = inv_freq.astype(np.float64)
    old = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    out = []
    for f in freq:
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.asarray(out).astype(np.float32)


def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Rotate-half rope on the first ``2 * len(inv_freq)`` dims of x [B, L, N, H]; angles are
    float32 ``position * inv_freq`` (the rest pass through)."""
    rot = 2 * len(inv_freq)
    angle = positions.astype(np.float32)[:, :, None] * inv_freq[None, None, :]  # float32
    angle = np.concatenate([angle, angle], axis=-1).astype(np.float64)[:, :, None, :]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotate_half = np.concatenate([-x_rot[..., half:], x_rot[..., :half]], axis=-1)
    return np.concatenate([x_rot * np.cos(angle) + rotate_half * np.sin(angle), x_pass], -1)


# ---------------------------------------------------------------------------- attention


def allowed(length: int, window: int | None, segments: np.ndarray | None) -> np.ndarray:
    """[B or 1, L, L]: causal, within ``window`` (the last ``window`` tokens, itself included)
    and within the token's segment."""
    q, k = np.arange(length)[:, None], np.arange(length)[None, :]
    mask = k <= q
    if window is not None:
        mask = mask & (q - k < window)
    mask = mask[None]
    if segments is not None:
        mask = mask & (segments[:, :, None] == segments[:, None, :])
    return mask


def self_attention(
    h: np.ndarray, w: dict[str, Any], spec: Spec, positions: np.ndarray, inv_freq: np.ndarray,
    mask: np.ndarray, q_norm: Any = None, k_norm: Any = None,
) -> np.ndarray:
    """Project, (norm the heads,) rope, repeat kv heads, softmax(q k * scale), project out."""

    def proj(name: str) -> np.ndarray:
        out = np.einsum("bld,dnh->blnh", h, w[name]["kernel"])
        return out + w[name]["bias"] if spec.qkv_bias or spec.bias else out

    q, k, v = proj("query"), proj("key"), proj("value")
    if spec.qk_norm:
        q, k = q_norm(q), k_norm(k)
    q, k = rope(q, positions, inv_freq), rope(k, positions, inv_freq)
    group = spec.num_heads // spec.num_kv_heads
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    scale = spec.head_dim**-0.5 if spec.query_scale is None else spec.query_scale
    scores = np.einsum("bqnh,bknh->bnqk", q, k) * scale
    if spec.attn_softcap:
        scores = spec.attn_softcap * np.tanh(scores / spec.attn_softcap)
    scores = np.where(mask[:, None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs = probs / probs.sum(-1, keepdims=True)
    context = np.einsum("bnqk,bknh->bqnh", probs, v)
    out = np.einsum("bqnh,nhd->bqd", context, w["out"]["kernel"])
    return out + w["out"]["bias"] if spec.bias else out


def dense(x: np.ndarray, w: dict[str, Any], bias: bool = False) -> np.ndarray:
    out = x @ w["kernel"]
    return out + w["bias"] if bias else out


def _inputs(params: dict, ids: np.ndarray, positions: np.ndarray | None) -> tuple:
    p = _float64(params)
    if positions is None:
        positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    return p, p["embedding"]["embedding"][ids], positions


def _float64(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _float64(v) for k, v in tree.items()}
    return np.asarray(tree, np.float64)


def _head(p: dict, x: np.ndarray, spec: Spec) -> np.ndarray:
    if spec.tied:
        return x @ p["embedding"]["embedding"].T
    return dense(x, p["softmax"], spec.bias)


# ------------------------------------------------------------------------------ families


def llama(params: dict, ids: np.ndarray, spec: Spec, positions: np.ndarray | None = None,
          segments: np.ndarray | None = None) -> np.ndarray:
    """Llama 2/3/3.1, Mistral, Qwen 2 (qkv biases) and Qwen 3 (per-head q/k RMSNorm):
    pre-RMSNorm, rope, SwiGLU ``down(silu(gate(x)) * up(x))``."""
    p, x, positions = _inputs(params, ids, positions)
    inv_freq = scaled_inv_freq(default_inv_freq(spec.head_dim, spec.rope_theta),
                               spec.rope_scaling)
    mask = allowed(ids.shape[1], spec.sliding_window, segments)
    for i in range(spec.num_layers):
        w = p["stack"][f"layer_{i}"]
        a = w["attention"]
        norms = {"q_norm": lambda t, a=a: rms_norm(t, a["query_norm"]["scale"], spec.eps),
                 "k_norm": lambda t, a=a: rms_norm(t, a["key_norm"]["scale"], spec.eps)}
        h = rms_norm(x, w["attention_norm"]["scale"], spec.eps)
        x = x + self_attention(h, a, spec, positions, inv_freq, mask, **norms)
        h = rms_norm(x, w["ffn_norm"]["scale"], spec.eps)
        f = w["ffn"]
        x = x + dense(silu(dense(h, f["wi_gate"])) * dense(h, f["wi"]), f["wo"])
    return _head(p, rms_norm(x, p["final_norm"]["scale"], spec.eps), spec)


def gemma(params: dict, ids: np.ndarray, spec: Spec, positions: np.ndarray | None = None,
          segments: np.ndarray | None = None) -> np.ndarray:
    """Gemma 2 and Gemma 3 (text): embeddings times sqrt(d); (1 + w) RMSNorms before and after
    each branch; q/k norms (Gemma 3); query_pre_attn_scalar; attention and final soft caps
    (Gemma 2); sliding layers except every ``sliding_pattern``-th, which are global (Gemma 3's
    local layers rope with their own base and no scaling); GeGLU (tanh); tied head."""
    p, x, positions = _inputs(params, ids, positions)
    x = x * math.sqrt(x.shape[-1])
    global_freq = scaled_inv_freq(default_inv_freq(spec.head_dim, spec.rope_theta),
                                  spec.rope_scaling)
    local_freq = (global_freq if spec.rope_local_theta is None
                  else default_inv_freq(spec.head_dim, spec.rope_local_theta))
    for i in range(spec.num_layers):
        is_global = (i + 1) % spec.sliding_pattern == 0
        mask = allowed(ids.shape[1], None if is_global else spec.sliding_window, segments)
        w = p["stack"][f"layer_{i}"]
        a = w["attention"]
        norms = {"q_norm": lambda t, a=a: gemma_rms_norm(t, a["query_norm"]["scale"], spec.eps),
                 "k_norm": lambda t, a=a: gemma_rms_norm(t, a["key_norm"]["scale"], spec.eps)}
        h = gemma_rms_norm(x, w["attention_norm"]["scale"], spec.eps)
        h = self_attention(h, a, spec, positions, global_freq if is_global else local_freq,
                           mask, **norms)
        x = x + gemma_rms_norm(h, w["post_attention_norm"]["scale"], spec.eps)
        h = gemma_rms_norm(x, w["ffn_norm"]["scale"], spec.eps)
        f = w["ffn"]
        h = dense(gelu_tanh(dense(h, f["wi_gate"])) * dense(h, f["wi"]), f["wo"])
        x = x + gemma_rms_norm(h, w["post_ffn_norm"]["scale"], spec.eps)
    logits = _head(p, gemma_rms_norm(x, p["final_norm"]["scale"], spec.eps), spec)
    if spec.final_softcap:
        logits = spec.final_softcap * np.tanh(logits / spec.final_softcap)
    return logits


def gpt_neox(params: dict, ids: np.ndarray, spec: Spec,
             positions: np.ndarray | None = None) -> np.ndarray:
    """GPT-NeoX with use_parallel_residual: ``x + attn(ln1(x)) + mlp(ln2(x))``, rope on the
    first rotary_pct of each head, biases everywhere, exact GELU, untied embed_out."""
    return _parallel(params, ids, spec, positions, shared=False, act=gelu)


def phi(params: dict, ids: np.ndarray, spec: Spec,
        positions: np.ndarray | None = None) -> np.ndarray:
    """Phi (phi-1, 1.5, 2): one input LayerNorm feeding attention and MLP in parallel,
    partial rope, biases everywhere, gelu_new, an lm_head with a bias."""
    return _parallel(params, ids, spec, positions, shared=True, act=gelu_tanh)


def _parallel(params: dict, ids: np.ndarray, spec: Spec, positions: np.ndarray | None, *,
              shared: bool, act: Any) -> np.ndarray:
    p, x, positions = _inputs(params, ids, positions)
    inv_freq = default_inv_freq(spec.rotary_dims or spec.head_dim, spec.rope_theta)
    mask = allowed(ids.shape[1], None, None)

    def ln(t: np.ndarray, w: dict) -> np.ndarray:
        return layer_norm(t, w["scale"], w["bias"], spec.eps)

    for i in range(spec.num_layers):
        w = p["stack"][f"layer_{i}"]
        h = ln(x, w["attention_norm"])
        attn = self_attention(h, w["attention"], spec, positions, inv_freq, mask)
        mlp_in = h if shared else ln(x, w["ffn_norm"])
        mlp = dense(act(dense(mlp_in, w["ffn"]["wi"], True)), w["ffn"]["wo"], True)
        x = mlp + attn + x
    return _head(p, ln(x, p["final_norm"]), spec)


def praxis(params: dict, ids: np.ndarray, spec: Spec, positions: np.ndarray | None = None, *,
           rotary: bool, gated: bool, act: Any) -> np.ndarray:
    """Praxis's TransformerLm as Pax's LM catalogue configures it (praxis 1.4): embeddings
    from the tied softmax table times sqrt(d), plus the [sin | cos] sinusoid (kept when the
    attention rotates too); pre-LayerNorms scaling by (1 + scale); queries rotated, then
    multiplied by softplus(w) / (ln 2 * sqrt(H)) per dimension; logits capped by
    ``attn_softcap``; feed-forward biases, the activation on the gate; a bias on the tied
    logits, capped by ``final_softcap``."""
    p, x, positions = _inputs(params, ids, positions)
    d = x.shape[-1]
    half = d // 2
    timescales = np.exp(np.arange(half) * -(math.log(10000.0) / max(half - 1, 1)))
    angles = positions[..., None] * timescales
    x = x * math.sqrt(d) + np.concatenate([np.sin(angles), np.cos(angles)], -1)
    inv_freq = default_inv_freq(spec.head_dim, spec.rope_theta)
    mask = allowed(ids.shape[1], None, None)

    def ln(t: np.ndarray, w: dict) -> np.ndarray:
        return layer_norm(t, 1.0 + w["scale"], w["bias"], spec.eps)

    for i in range(spec.num_layers):
        w = p["stack"][f"layer_{i}"]
        a = w["attention"]
        h = ln(x, w["attention_norm"])
        q, k, v = (np.einsum("bld,dnh->blnh", h, a[n]["kernel"]) for n in ("query", "key",
                                                                            "value"))
        if rotary:
            q, k = rope(q, positions, inv_freq), rope(k, positions, inv_freq)
        softplus = np.logaddexp(0.0, a["per_dim_scale"])
        q = q * softplus / (math.log(2.0) * math.sqrt(spec.head_dim))
        scores = np.einsum("bqnh,bknh->bnqk", q, k)
        scores = spec.attn_softcap * np.tanh(scores / spec.attn_softcap)
        scores = np.where(mask[:, None], scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs = probs / probs.sum(-1, keepdims=True)
        context = np.einsum("bnqk,bknh->bqnh", probs, v)
        x = x + np.einsum("bqnh,nhd->bqd", context, a["out"]["kernel"])
        h = ln(x, w["ffn_norm"])
        f = w["ffn"]
        hidden = dense(h, f["wi"], True)
        hidden = act(dense(h, f["wi_gate"], True)) * hidden if gated else act(hidden)
        x = x + dense(hidden, f["wo"], True)
    logits = ln(x, p["final_norm"]) @ p["embedding"]["embedding"].T + p["softmax"]["bias"]
    return spec.final_softcap * np.tanh(logits / spec.final_softcap)
