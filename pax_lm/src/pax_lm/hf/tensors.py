"""Hugging Face tensor names and layouts <-> pax-transformer's parameters.

Each family names its tensors one of a few ways (``NAMINGS``); a naming lists, for a model,
``Entry``s: one or more Hugging Face tensors that become one or more Pax parameters, with the
conversion each way. Hugging Face keeps a linear layer's weight as [out, in]; Pax keeps a
kernel as [in, out] with the heads as axes of their own ([d, heads, dim_per_head] for the
query, [heads, dim_per_head, d] for the output), so most conversions are a transpose and a
reshape. GPT-2 stores its projections as [in, out] already (its ``Conv1D``) and fuses query,
key and value into one tensor; GPT-NeoX fuses them per head ([heads, 3, dim_per_head] rows).
Mixtral keeps each expert's three projections as linear layers of their own (``w1`` the gate,
``w3`` the up projection, ``w2`` the down one: the layout of the published checkpoints, which
transformers 5 still writes and fuses only as it loads); Pax stacks the experts into one
[experts, in, out] array of each. Every conversion is a permutation of the values, so a round
trip is exact.

A scanned stack keeps each weight of all layers in one array (a leading layers axis): its
entries stack the layers' tensors, and export slices them again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from pax_lm.hf.families import sparse_part

Arrays = list[np.ndarray]


@dataclasses.dataclass(frozen=True)
class Entry:
    """Hugging Face tensors ``hf`` <-> Pax parameters ``pax`` (key paths below the decoder),
    with the conversion each way and the shapes the Hugging Face tensors must have."""

    hf: tuple[str, ...]
    pax: tuple[tuple[str, ...], ...]
    to_pax: Callable[[Arrays], Arrays]
    to_hf: Callable[[Arrays], Arrays]
    hf_shapes: tuple[tuple[int, ...], ...]


def _same(shape: tuple[int, ...]) -> tuple[Callable, Callable, tuple]:
    return (lambda a: a), (lambda a: a), shape


def _linear(din: int, out: tuple[int, ...]) -> tuple[Callable, Callable, tuple]:
    """HF [prod(out), din] <-> Pax [din, *out]."""
    size = int(np.prod(out))
    return (lambda a: a.T.reshape(din, *out)), (lambda k: k.reshape(din, size).T), (size, din)


def _linear_out(heads: tuple[int, ...], dout: int) -> tuple[Callable, Callable, tuple]:
    """HF [dout, prod(heads)] <-> Pax [*heads, dout]."""
    size = int(np.prod(heads))
    return (lambda a: a.T.reshape(*heads, dout)), (lambda k: k.reshape(size, dout).T), (dout, size)


def _conv(din: tuple[int, ...], dout: tuple[int, ...]) -> tuple[Callable, Callable, tuple]:
    """GPT-2's [prod(din), prod(dout)] <-> Pax [*din, *dout]: a reshape."""
    flat = (int(np.prod(din)), int(np.prod(dout)))
    return (lambda a: a.reshape(*din, *dout)), (lambda k: k.reshape(flat)), flat


def _reshape(hf: tuple[int, ...], pax: tuple[int, ...]) -> tuple[Callable, Callable, tuple]:
    return (lambda a: a.reshape(pax)), (lambda k: k.reshape(hf)), hf


def _one(hf: str, pax: str, conversion: tuple[Callable, Callable, tuple]) -> Entry:
    to_pax, to_hf, shape = conversion
    return Entry((hf,), (tuple(pax.split("/")),), lambda a: [to_pax(a[0])],
                 lambda k: [to_hf(k[0])], (shape,))


class _Dims:
    """The sizes a naming needs, from a pax-transformer ``TransformerLm``."""

    def __init__(self, m: Any):
        self.d, self.f, self.v = m.model_dims, m.hidden_dims, m.vocab_size
        self.n, self.k, self.h = m.num_heads, m.kv_heads, m.head_dims
        self.m = m


def _norm(hf: str, pax: str, dims: _Dims, size: int | None = None) -> list[Entry]:
    """A norm's scale (``weight``) and, for a layernorm, its bias."""
    size = size or dims.d
    entries = [_one(f"{hf}.weight", f"{pax}/scale", _same((size,)))]
    if dims.m.norm == "layernorm":
        entries.append(_one(f"{hf}.bias", f"{pax}/bias", _same((size,))))
    return entries


def _separate_qkv(prefix: str, dims: _Dims, names: tuple[str, str, str, str],
                  biases: bool, out_bias: bool) -> list[Entry]:
    """Query, key, value and output projections as four linear layers (Llama's layout)."""
    q, k, v, o = names
    heads = {q: ("query", dims.n), k: ("key", dims.k), v: ("value", dims.k)}
    entries = []
    for hf, (pax, count) in heads.items():
        entries.append(_one(f"{prefix}.{hf}.weight", f"attention/{pax}/kernel",
                            _linear(dims.d, (count, dims.h))))
        if biases:
            entries.append(_one(f"{prefix}.{hf}.bias", f"attention/{pax}/bias",
                                _reshape((count * dims.h,), (count, dims.h))))
    entries.append(_one(f"{prefix}.{o}.weight", "attention/out/kernel",
                        _linear_out((dims.n, dims.h), dims.d)))
    if out_bias:
        entries.append(_one(f"{prefix}.{o}.bias", "attention/out/bias", _same((dims.d,))))
    return entries


def _llama_layer(p: str, dims: _Dims, post_norms: bool, sparse: bool) -> list[Entry]:
    m = dims.m
    entries = _norm(f"{p}.input_layernorm", "attention_norm", dims)
    entries += _separate_qkv(f"{p}.self_attn", dims, ("q_proj", "k_proj", "v_proj", "o_proj"),
                             m.qkv_bias, False)
    if m.qk_norm:
        entries += _norm(f"{p}.self_attn.q_norm", "attention/query_norm", dims, dims.h)
        entries += _norm(f"{p}.self_attn.k_norm", "attention/key_norm", dims, dims.h)
    if post_norms:
        entries += _norm(f"{p}.post_attention_layernorm", "post_attention_norm", dims)
        entries += _norm(f"{p}.pre_feedforward_layernorm", "ffn_norm", dims)
        entries += _norm(f"{p}.post_feedforward_layernorm", "post_ffn_norm", dims)
    else:
        entries += _norm(f"{p}.post_attention_layernorm", "ffn_norm", dims)
    if sparse:
        return entries + _experts(f"{p}.block_sparse_moe", dims)
    return [
        *entries,
        _one(f"{p}.mlp.gate_proj.weight", "ffn/wi_gate/kernel", _linear(dims.d, (dims.f,))),
        _one(f"{p}.mlp.up_proj.weight", "ffn/wi/kernel", _linear(dims.d, (dims.f,))),
        _one(f"{p}.mlp.down_proj.weight", "ffn/wo/kernel", _linear(dims.f, (dims.d,))),
    ]


def _experts(p: str, dims: _Dims) -> list[Entry]:
    """Mixtral's sparse feed-forward: the router ``gate`` [E, d] <-> Pax's [d, E], and each
    expert's ``w1`` (gate) and ``w3`` (up) [f, d] and ``w2`` (down) [d, f], one tensor an
    expert <-> Pax's ``wi_gate``, ``wi`` [E, d, f] and ``wo`` [E, f, d]."""
    experts = sparse_part(dims.m)
    count, d, f = experts.num_experts, dims.d, experts.hidden_dims

    def stacked(name: str, pax: str, shape: tuple[int, int]) -> Entry:
        return Entry(tuple(f"{p}.experts.{j}.{name}.weight" for j in range(count)),
                     (("ffn", pax),), lambda a: [np.stack([x.T for x in a])],
                     lambda k: [x.T for x in k[0]], (shape,) * count)

    return [_one(f"{p}.gate.weight", "ffn/router", _linear(d, (count,))),
            stacked("w1", "wi_gate", (f, d)), stacked("w3", "wi", (f, d)),
            stacked("w2", "wo", (d, f))]


def _head(dims: _Dims, name: str, bias: bool) -> list[Entry]:
    """The output projection of an untied model: HF [V, d] <-> Pax [d, V]."""
    if dims.m.tied_embedding:
        return []
    entries = [_one(f"{name}.weight", "softmax/kernel", _linear(dims.d, (dims.v,)))]
    if bias:
        entries.append(_one(f"{name}.bias", "softmax/bias", _same((dims.v,))))
    return entries


def _llama(dims: _Dims, post_norms: bool = False, sparse: bool = False
           ) -> tuple[list[Entry], list[list[Entry]]]:
    top = [_one("model.embed_tokens.weight", "embedding/embedding", _same((dims.v, dims.d)))]
    top += _norm("model.norm", "final_norm", dims) + _head(dims, "lm_head", False)
    layers = [_llama_layer(f"model.layers.{i}", dims, post_norms, sparse)
              for i in range(dims.m.num_layers)]
    return top, layers


def _gpt2_qkv(p: str, dims: _Dims) -> list[Entry]:
    """GPT-2's c_attn: [d, 3*d] (query, key, value side by side) and its bias [3*d]."""
    n, h, d = dims.n, dims.h, dims.d

    def split(w: np.ndarray, lead: tuple[int, ...]) -> Arrays:
        return [part.reshape(*lead, n, h) for part in np.split(w, 3, axis=-1)]

    paths = tuple(("attention", x, "kernel") for x in ("query", "key", "value"))
    bias_paths = tuple(("attention", x, "bias") for x in ("query", "key", "value"))
    return [
        Entry((f"{p}.attn.c_attn.weight",), paths, lambda a: split(a[0], (d,)),
              lambda k: [np.concatenate([x.reshape(d, n * h) for x in k], axis=-1)],
              ((d, 3 * n * h),)),
        Entry((f"{p}.attn.c_attn.bias",), bias_paths, lambda a: split(a[0], ()),
              lambda k: [np.concatenate([x.reshape(n * h) for x in k])], ((3 * n * h,),)),
    ]


def _gpt2(dims: _Dims) -> tuple[list[Entry], list[list[Entry]]]:
    d, f = dims.d, dims.f
    top = [_one("transformer.wte.weight", "embedding/embedding", _same((dims.v, d))),
           _one("transformer.wpe.weight", "position/embedding", _same((dims.m.max_seq_len, d)))]
    top += _norm("transformer.ln_f", "final_norm", dims)
    layers = []
    for i in range(dims.m.num_layers):
        p = f"transformer.h.{i}"
        layers.append([
            *_norm(f"{p}.ln_1", "attention_norm", dims), *_gpt2_qkv(p, dims),
            _one(f"{p}.attn.c_proj.weight", "attention/out/kernel", _conv((dims.n, dims.h), (d,))),
            _one(f"{p}.attn.c_proj.bias", "attention/out/bias", _same((d,))),
            *_norm(f"{p}.ln_2", "ffn_norm", dims),
            _one(f"{p}.mlp.c_fc.weight", "ffn/wi/kernel", _conv((d,), (f,))),
            _one(f"{p}.mlp.c_fc.bias", "ffn/wi/bias", _same((f,))),
            _one(f"{p}.mlp.c_proj.weight", "ffn/wo/kernel", _conv((f,), (d,))),
            _one(f"{p}.mlp.c_proj.bias", "ffn/wo/bias", _same((d,))),
        ])
    return top, layers


def _neox_qkv(p: str, dims: _Dims) -> list[Entry]:
    """GPT-NeoX's query_key_value: rows [heads, 3, dim_per_head] of [.., d], and its bias."""
    n, h, d = dims.n, dims.h, dims.d
    paths = tuple(("attention", x, "kernel") for x in ("query", "key", "value"))
    bias_paths = tuple(("attention", x, "bias") for x in ("query", "key", "value"))

    def kernels(a: Arrays) -> Arrays:
        w = a[0].reshape(n, 3, h, d)
        return [w[:, j].transpose(2, 0, 1) for j in range(3)]

    def fused(k: Arrays) -> Arrays:
        return [np.stack([x.transpose(1, 2, 0) for x in k], axis=1).reshape(3 * n * h, d)]

    return [
        Entry((f"{p}.attention.query_key_value.weight",), paths, kernels, fused,
              ((3 * n * h, d),)),
        Entry((f"{p}.attention.query_key_value.bias",), bias_paths,
              lambda a: [a[0].reshape(n, 3, h)[:, j] for j in range(3)],
              lambda k: [np.stack(k, axis=1).reshape(3 * n * h)], ((3 * n * h,),)),
    ]


def _neox(dims: _Dims) -> tuple[list[Entry], list[list[Entry]]]:
    d, f = dims.d, dims.f
    top = [_one("gpt_neox.embed_in.weight", "embedding/embedding", _same((dims.v, d)))]
    top += _norm("gpt_neox.final_layer_norm", "final_norm", dims) + _head(dims, "embed_out", False)
    layers = []
    for i in range(dims.m.num_layers):
        p = f"gpt_neox.layers.{i}"
        layers.append([
            *_norm(f"{p}.input_layernorm", "attention_norm", dims),
            *_norm(f"{p}.post_attention_layernorm", "ffn_norm", dims), *_neox_qkv(p, dims),
            _one(f"{p}.attention.dense.weight", "attention/out/kernel",
                 _linear_out((dims.n, dims.h), d)),
            _one(f"{p}.attention.dense.bias", "attention/out/bias", _same((d,))),
            _one(f"{p}.mlp.dense_h_to_4h.weight", "ffn/wi/kernel", _linear(d, (f,))),
            _one(f"{p}.mlp.dense_h_to_4h.bias", "ffn/wi/bias", _same((f,))),
            _one(f"{p}.mlp.dense_4h_to_h.weight", "ffn/wo/kernel", _linear(f, (d,))),
            _one(f"{p}.mlp.dense_4h_to_h.bias", "ffn/wo/bias", _same((d,))),
        ])
    return top, layers


def _phi(dims: _Dims) -> tuple[list[Entry], list[list[Entry]]]:
    d, f = dims.d, dims.f
    top = [_one("model.embed_tokens.weight", "embedding/embedding", _same((dims.v, d)))]
    top += _norm("model.final_layernorm", "final_norm", dims) + _head(dims, "lm_head", True)
    layers = []
    for i in range(dims.m.num_layers):
        p = f"model.layers.{i}"
        layers.append([
            *_norm(f"{p}.input_layernorm", "attention_norm", dims),
            *_separate_qkv(f"{p}.self_attn", dims, ("q_proj", "k_proj", "v_proj", "dense"),
                           True, True),
            _one(f"{p}.mlp.fc1.weight", "ffn/wi/kernel", _linear(d, (f,))),
            _one(f"{p}.mlp.fc1.bias", "ffn/wi/bias", _same((f,))),
            _one(f"{p}.mlp.fc2.weight", "ffn/wo/kernel", _linear(f, (d,))),
            _one(f"{p}.mlp.fc2.bias", "ffn/wo/bias", _same((d,))),
        ])
    return top, layers


NAMINGS: dict[str, Callable[[_Dims], tuple[list[Entry], list[list[Entry]]]]] = {
    "llama": _llama,
    "gemma2": lambda dims: _llama(dims, post_norms=True),
    "mixtral": lambda dims: _llama(dims, sparse=True),
    "gpt2": _gpt2,
    "gpt_neox": _neox,
    "phi": _phi,
}
# Buffers some checkpoints carry that are not weights (attention masks, rotary tables).
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".attention.bias",
                    ".attention.masked_bias", ".rotary_emb.inv_freq")


def entries(naming: str, model: Any) -> list[Entry]:
    """The entries of ``model`` (a pax-transformer ``TransformerLm``), with Pax paths in the
    model's own layout: a scanned stack's layers are stacked into its ``layers`` arrays."""
    top, layers = NAMINGS[naming](_Dims(model))
    looped = [_under(e, ("stack", f"layer_{i}")) for i, layer in enumerate(layers)
              for e in layer]
    if not model.scan_layers:
        return top + looped
    return top + [_stacked([layer[j] for layer in layers]) for j in range(len(layers[0]))]


def _under(entry: Entry, prefix: tuple[str, ...]) -> Entry:
    return dataclasses.replace(entry, pax=tuple(prefix + p for p in entry.pax))


def _stacked(per_layer: list[Entry]) -> Entry:
    """The same entry of every layer as one, over the scanned stack's stacked arrays."""
    first = per_layer[0]

    def to_pax(arrays: Arrays) -> Arrays:
        width = len(first.hf)
        parts = [e.to_pax(arrays[i * width:(i + 1) * width]) for i, e in enumerate(per_layer)]
        return [np.stack(group) for group in zip(*parts, strict=True)]

    def to_hf(kernels: Arrays) -> Arrays:
        return [a for i, e in enumerate(per_layer) for a in e.to_hf([k[i] for k in kernels])]

    return Entry(tuple(n for e in per_layer for n in e.hf),
                 tuple(("stack", "layers", *p) for p in first.pax), to_pax, to_hf,
                 tuple(s for e in per_layer for s in e.hf_shapes))
