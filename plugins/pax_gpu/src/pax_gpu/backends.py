"""The ``gpu`` backend: NVIDIA's recommended runtime settings, the device check, the refusal of
FP8 on GPUs without FP8 tensor cores, and cuDNN's fused attention where cuDNN can serve the
shape (XLA's otherwise, said once per reason)."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import jax
import jax.extend.core
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from pax_core import ATTENTION_RESIDUALS, Backend, Preset, UsageError, warn
from pax_gpu.presets import PRESETS

# cuDNN's flash attention needs Ampere or newer (bf16 tensor cores).
MIN_COMPUTE_CAPABILITY = (8, 0)
# FP8 tensor cores came with Ada (8.9) and Hopper (9.0); before them XLA computes an FP8
# matmul in wider types, as slow as bfloat16's or slower, with FP8's rounding.
MIN_FP8_COMPUTE_CAPABILITY = (8, 9)
MAX_HEAD_DIM = 128
_told: set[str] = set()


def capability(compute_capability: str) -> tuple[int, ...] | None:
    """``"9.0"`` as ``(9, 0)``; None for a platform that names its capability otherwise
    (ROCm's ``gfx90a``), which these checks leave alone."""
    try:
        return tuple(int(x) for x in str(compute_capability).split("."))
    except ValueError:
        return None


def fp8_unsupported(compute_capability: str) -> str | None:
    """Why a GPU of this compute capability cannot run FP8 matmuls on FP8 tensor cores, or None
    when it can (or when the capability is not CUDA's to judge)."""
    found = capability(compute_capability)
    if found is None or found >= MIN_FP8_COMPUTE_CAPABILITY:
        return None
    return (f"compute capability {compute_capability}: FP8 tensor cores need 8.9 or newer "
            f"(Ada, Hopper, Blackwell)")


def _inner_jaxprs(params: dict[str, Any]) -> list[jax.extend.core.Jaxpr]:
    """The jaxprs an equation holds (a scan's body, a custom_vjp's function, a cond's
    branches)."""
    found = []
    for value in params.values():
        for item in value if isinstance(value, tuple | list) else (value,):
            if isinstance(item, jax.extend.core.ClosedJaxpr):
                found.append(item.jaxpr)
            elif isinstance(item, jax.extend.core.Jaxpr):
                found.append(item)
    return found


def computes_in_fp8(program: jax.extend.core.ClosedJaxpr) -> bool:
    """Whether any value ``program`` computes, inner jaxprs included, is an 8-bit float: the
    sign of an FP8 matmul, whichever library put it there."""
    pending = [program.jaxpr]
    while pending:
        jaxpr = pending.pop()
        for eqn in jaxpr.eqns:
            if any(str(getattr(v.aval, "dtype", "")).startswith("float8") for v in eqn.outvars):
                return True
            pending += _inner_jaxprs(eqn.params)
    return False


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


def cudnn_attention(query: jax.Array, key: jax.Array, value: jax.Array, *, is_causal: bool,
                    segment_ids: jax.Array | None) -> jax.Array:
    """cuDNN's fused attention, with the causal mask as cuDNN's own and packed segments as a
    mask: what the backend serves where ``cudnn_unsupported`` finds nothing against it, and
    what ``pax gpu check`` measures. Raises where no cuDNN can run (off a GPU)."""
    segments = segment_mask(segment_ids) if segment_ids is not None else None
    return jax.nn.dot_product_attention(query, key, value, mask=segments, is_causal=is_causal,
                                        implementation="cudnn")


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
            found = capability(device.compute_capability)
            if found is not None and found < MIN_COMPUTE_CAPABILITY:
                raise UsageError(
                    f"GPU {device.id} ({device.device_kind}) has compute capability "
                    f"{device.compute_capability}; Pax needs 8.0 or newer (Ampere: bfloat16 "
                    f"and fused attention); run on A100, H100, H200 or newer")

    def check_program(self, devices: list[Any], program: jax.extend.core.ClosedJaxpr) -> None:
        """Refuse a run that computes in FP8 on GPUs without FP8 tensor cores: XLA would run
        it, in wider types and no faster than bfloat16, while the run pays FP8's rounding."""
        if not computes_in_fp8(program):
            return
        for device in devices:
            reason = fp8_unsupported(getattr(device, "compute_capability", ""))
            if reason is not None:
                raise UsageError(
                    f"this run computes in FP8, and GPU {device.id} ({device.device_kind}) "
                    f"has {reason}; turn FP8 off (pax-lm: --set USE_FP8=False) or run on "
                    f"H100, H200, L4 or newer")

    def attention(self, query: jax.Array, key: jax.Array, value: jax.Array, *,
                  mask: jax.Array | None, is_causal: bool, segment_ids: jax.Array | None,
                  window: int = 0, logit_cap: float = 0.0, scale: float | None = None
                  ) -> jax.Array:
        if window or logit_cap or scale is not None:
            reason = "a sliding window, a logit cap or a scale of the layer's own"
        else:
            reason = cudnn_unsupported(query, key, mask=mask, is_causal=is_causal,
                                       segment_ids=segment_ids)
        if reason is None:
            try:
                # Its output is what the layer's backward pass needs kept (the kernel's own
                # statistics it recomputes).
                return checkpoint_name(cudnn_attention(query, key, value, is_causal=is_causal,
                                                       segment_ids=segment_ids),
                                       ATTENTION_RESIDUALS)
            except (ValueError, RuntimeError, NotImplementedError) as e:
                reason = f"a shape this cuDNN refuses ({str(e).splitlines()[0]})"
        _notice(reason)
        return super().attention(query, key, value, mask=mask, is_causal=is_causal,
                                 segment_ids=segment_ids, window=window, logit_cap=logit_cap,
                                 scale=scale)
