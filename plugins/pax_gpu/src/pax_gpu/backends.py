"""The ``gpu`` backend: NVIDIA's recommended runtime settings, the device check, and cuDNN's
fused attention where cuDNN can serve the shape (XLA's otherwise, said once per reason)."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import jax
import jax.numpy as jnp

from pax_core import Backend, Preset, UsageError, warn
from pax_gpu.presets import PRESETS

# cuDNN's flash attention needs Ampere or newer (bf16 tensor cores).
MIN_COMPUTE_CAPABILITY = (8, 0)
MAX_HEAD_DIM = 128
_told: set[str] = set()


def cudnn_unsupported(query: jax.Array, key: jax.Array, *, mask: jax.Array | None,
                      is_causal: bool, segment_ids: jax.Array | None) -> str | None:
    """Why cuDNN's fused attention cannot serve these inputs, or None when it can."""
    if query.dtype not in (jnp.bfloat16, jnp.float16):
        return f"{query.dtype} inputs (cuDNN's fused attention takes bfloat16 or float16)"
    head_dim = query.shape[-1]
    if head_dim % 8 or head_dim > MAX_HEAD_DIM:
        return f"head dim {head_dim} (cuDNN takes multiples of 8 up to {MAX_HEAD_DIM})"
    if is_causal and query.shape[1] != key.shape[1]:
        return (f"a causal mask over {query.shape[1]} queries and {key.shape[1]} keys "
                f"(cuDNN's causal mask is square)")
    if mask is not None and not is_causal and segment_ids is None:
        return "a mask that is neither causal nor by segment (a decoding cache's)"
    return None


def segment_mask(segment_ids: jax.Array) -> jax.Array:
    """[B, 1, T, T]: a query sees the keys of its own packed segment."""
    return (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]


def visible_gpus() -> list[str]:
    """This process's GPUs as CUDA numbers them, without starting JAX."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip()]
    try:
        found = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                               timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(ln for ln in found.splitlines()
                                            if ln.startswith("GPU "))]


def _notice(reason: str) -> None:
    if reason not in _told:
        _told.add(reason)
        warn(f"attention runs on XLA, not cuDNN, for {reason}")


class GpuBackend(Backend):
    """NVIDIA GPUs through the CUDA jaxlib (``pax-gpu[cuda12]``)."""

    platform = "gpu"

    def presets(self) -> list[Preset]:
        return list(PRESETS)

    def share(self, index: int, count: int) -> dict[str, str]:
        """The ``index``-th of ``count`` equal runs of this host's GPUs (those in
        ``CUDA_VISIBLE_DEVICES``, else those ``nvidia-smi -L`` lists), as its
        ``CUDA_VISIBLE_DEVICES``; nothing where no GPU is known."""
        gpus = visible_gpus()
        if not gpus:
            return {}
        if len(gpus) < count:
            raise UsageError(f"{count} trials at once need a GPU each, and this host has "
                             f"{len(gpus)}; use --parallel {len(gpus)} or fewer")
        each = len(gpus) // count
        return {"CUDA_VISIBLE_DEVICES": ",".join(gpus[index * each:(index + 1) * each])}

    def check(self, devices: list[Any]) -> None:
        for device in devices:
            if device.platform not in ("gpu", "cuda"):
                raise UsageError(f"the gpu backend got {device.platform} device {device.id}; "
                                 f"install pax-gpu[cuda12] on a machine with NVIDIA GPUs, or "
                                 f"run with --platform cpu")
            try:
                capability = tuple(int(x) for x in str(device.compute_capability).split("."))
            except ValueError:  # a platform that names its capability otherwise (ROCm)
                continue
            if capability < MIN_COMPUTE_CAPABILITY:
                raise UsageError(
                    f"GPU {device.id} ({device.device_kind}) has compute capability "
                    f"{device.compute_capability}; Pax needs 8.0 or newer (Ampere: bfloat16 "
                    f"and fused attention); run on A100, H100, H200 or newer")

    def attention(self, query: jax.Array, key: jax.Array, value: jax.Array, *,
                  mask: jax.Array | None, is_causal: bool,
                  segment_ids: jax.Array | None) -> jax.Array:
        reason = cudnn_unsupported(query, key, mask=mask, is_causal=is_causal,
                                   segment_ids=segment_ids)
        if reason is None:
            segments = segment_mask(segment_ids) if segment_ids is not None else None
            try:
                return jax.nn.dot_product_attention(query, key, value, mask=segments,
                                                    is_causal=is_causal,
                                                    implementation="cudnn")
            except (ValueError, RuntimeError, NotImplementedError) as e:
                reason = f"a shape this cuDNN refuses ({str(e).splitlines()[0]})"
        _notice(reason)
        return super().attention(query, key, value, mask=mask, is_causal=is_causal,
                                 segment_ids=segment_ids)
