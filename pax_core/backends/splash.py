"""Splash attention: the Pallas TPU kernel (``jax.experimental.pallas.ops.tpu.splash_attention``)
that the tpu backend serves ``pax_core.dot_product_attention`` with.

Why a kernel: XLA's attention materialises the [T, S] scores of every head in HBM, and on a v5e
(the TPU with the least HBM bandwidth per FLOP) that makes attention memory-bound: it was about
70 % of a 2,048-token step's predicted time. Splash computes the softmax blockwise on chip and
skips the blocks its mask leaves empty (half of a causal mask, most of a sliding window's).

What it serves: self-attention (T == S, a multiple of 128) that is causal or not, grouped-query,
with a sliding window (with ``is_causal``), segment ids for packed rows and a logit soft cap; a
scale of the layer's own is applied to the queries first. What it does not (a decoding cache's
offset mask, a scanned layer's per-layer window, a sequence split over devices) is said by
``splash_unsupported`` and left to XLA.

The kernel's output and softmax statistics, what its backward pass reads, carry the checkpoint
name ``pax_core.ATTENTION_RESIDUALS``: a remat policy that saves them spares the backward pass
recomputing the attention (the model's own ``context`` name is on the output after it is laid
back out, which the kernel's backward pass does not read).

Under a mesh of several devices the kernel runs per device through ``jax.shard_map``, the batch
and the heads split as the logical axis rules split them. ``interpret=True`` runs the kernel's
own program through Pallas' interpreter, on any platform: the parity tests use it on CPU.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from pax_core import axes
from pax_core.backends.base import ATTENTION_RESIDUALS

# Splash tiles the sequence in blocks of these sizes, the largest that divides it first, and
# computes a block's keys 512 at a time. On a v5e at 2,048 tokens of 64-wide heads, 1,024 with a
# fused backward pass and keys laid out sequence-minor was 25 % faster than 512 with two backward
# passes, and 2,048 overflowed the kernel's on-chip memory (bench/tpu_train.py's ``splash``
# step); 128 is the kernel's lane width. Float32 inputs take blocks of at most 512: at 1,024 their
# products at full precision overflowed the kernel's 16 MiB of scoped on-chip memory by 260 KiB
# (the ``parity`` step at 3ed7a2b).
BLOCKS = (1024, 512, 256, 128)
WIDE_BLOCK = 512
KV_COMPUTE = 512
_QKV = (axes.BATCH, axes.LENGTH, axes.HEADS, axes.KV)


def splash_unsupported(query: jax.Array, key: jax.Array, *, mask: jax.Array | None,
                       is_causal: bool, segment_ids: jax.Array | None) -> str | None:
    """Why Splash cannot serve this attention, or None when it can."""
    length, keys = query.shape[1], key.shape[1]
    if mask is not None and not is_causal and segment_ids is None:
        return ("a mask that is neither causal nor by segment (a decoding cache's, or a scanned "
                "layer's own window)")
    if length != keys:
        return f"{length} queries over {keys} keys (Splash serves self-attention)"
    if length % BLOCKS[-1]:
        return f"a sequence of {length} (Splash's blocks take multiples of {BLOCKS[-1]})"
    split = _split(query, key)
    return split if isinstance(split, str) else None


def _split(query: jax.Array, key: jax.Array) -> str | tuple[Any, Any, Any] | None:
    """(mesh, batch axes, head axes) when a mesh of several devices is set, None without one,
    or why the split does not suit the kernel."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1 or mesh.are_all_axes_manual:
        return None  # one device, or inside a shard_map: the arrays are this device's own
    if mesh.manual_axes:
        return f"a mesh split by hand over {list(mesh.manual_axes)} and by the compiler too"
    import flax.linen as nn

    batch, length, heads, dims = nn.logical_to_mesh_axes(_QKV)
    if length is not None or dims is not None:
        return (f"a sequence or head dimension split over the mesh ({length or dims}); Splash "
                f"takes whole ones")
    ways = math.prod(mesh.shape[a] for a in _names(heads))
    if query.shape[2] % ways or key.shape[2] % ways:
        return (f"{query.shape[2]} query and {key.shape[2]} key heads over {ways} devices of "
                f"the heads' mesh axes")
    return mesh, batch, heads


def _names(spec: Any) -> tuple[str, ...]:
    return spec if isinstance(spec, tuple) else (spec,) if spec else ()


def splash_attention(query: jax.Array, key: jax.Array, value: jax.Array, *, is_causal: bool,
                     segment_ids: jax.Array | None, window: int = 0, logit_cap: float = 0.0,
                     scale: float | None = None, interpret: bool = False) -> jax.Array:
    """``pax_core.dot_product_attention`` through Splash, where ``splash_unsupported`` found
    nothing against it: query [B, T, N, H], key and value [B, T, K, H] -> [B, T, N, H]."""
    split = _split(query, key)
    if isinstance(split, str):
        raise ValueError(f"Splash cannot serve {split}; ask splash_unsupported first")
    heads = query.shape[2] // (1 if split is None else
                               math.prod(split[0].shape[a] for a in _names(split[2])))
    kernel = _kernel(heads, query.shape[1], query.dtype.itemsize, is_causal, window,
                     logit_cap or None, interpret)
    factor = query.shape[-1] ** -0.5 if scale is None else scale

    def local(q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array | None
              ) -> jax.Array:
        q = (q * factor).astype(q.dtype)  # Splash leaves the scale to its caller
        q, k, v = (jnp.swapaxes(t, 1, 2) for t in (q, k, v))  # [B, heads, T, H]
        if segments is None:
            out = jax.vmap(kernel)(q, k, v)
        else:
            from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

            out = jax.vmap(lambda q, k, v, s: kernel(q, k, v, segment_ids=SegmentIds(s, s)))(
                q, k, v, segments.astype(jnp.int32))
        return jnp.swapaxes(out, 1, 2)

    if split is None:
        return local(query, key, value, segment_ids)
    from jax.sharding import PartitionSpec

    mesh, batch, head_axes = split
    qkv = PartitionSpec(batch, None, head_axes, None)
    segments = None if segment_ids is None else PartitionSpec(batch, None)
    return jax.shard_map(local, mesh=mesh, in_specs=(qkv, qkv, qkv, segments), out_specs=qkv,
                         check_vma=False)(query, key, value, segment_ids)


def block_sizes(length: int, itemsize: int = 2) -> Any:
    """Splash's tiles for a sequence of ``length`` of ``itemsize``-byte inputs: the largest of
    ``BLOCKS`` that divides it (at most ``WIDE_BLOCK`` past 2 bytes), for the forward pass and
    the one backward kernel that computes dq, dk and dv together."""
    from jax.experimental.pallas.ops.tpu.splash_attention import BlockSizes, QKVLayout

    block = next(b for b in BLOCKS if length % b == 0 and (itemsize <= 2 or b <= WIDE_BLOCK))
    compute = min(block, KV_COMPUTE)
    return BlockSizes(block_q=block, block_kv=block, block_kv_compute=compute,
                      block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=compute,
                      use_fused_bwd_kernel=True, k_layout=QKVLayout.SEQ_MINOR)


@functools.lru_cache(maxsize=64)
def _kernel(heads: int, length: int, itemsize: int, is_causal: bool, window: int,
            logit_cap: float | None, interpret: bool) -> Any:
    """The kernel for one device's ``heads`` over a sequence of ``length`` (inputs of
    ``itemsize`` bytes), built once: its
    mask's block structure is worked out in NumPy when it is made."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    shape = (length, length)
    if window:
        mask = splash.LocalMask(shape, window_size=(window - 1, 0), offset=0)
    elif is_causal:
        mask = splash.CausalMask(shape)
    else:
        mask = splash.FullMask(shape)
    with jax.ensure_compile_time_eval():  # concrete arrays, though built while tracing a step
        return splash.make_splash_mha(
            splash.MultiHeadMask([mask] * heads), block_sizes=block_sizes(length, itemsize),
            head_shards=1, q_seq_shards=1, attn_logits_soft_cap=logit_cap,
            residual_checkpoint_name=ATTENTION_RESIDUALS, interpret=interpret)
