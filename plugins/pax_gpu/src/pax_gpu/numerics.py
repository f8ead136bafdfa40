"""What ``pax gpu check`` measures: the gpu backend's cuDNN attention and the FP8 matmul, each
against a reference computed on the same device, within a tolerance set by the precision
under test.

* Attention: the backend's two paths, cuDNN's fused kernel (``cudnn_attention``, what the
  backend serves) and XLA's (``pax_core.Backend.attention``, where it falls back), in bfloat16
  and float16, forward and gradients (dQ, dK, dV for one random output gradient), each against
  XLA's attention in float32 at the highest matmul precision on the same rounded inputs.
* FP8: Flax's ``Fp8DirectDotGeneralOp`` with the dimension numbers of pax-transformer's
  projections, after one step of delayed scaling (so that its scales are the inputs' largest
  magnitudes, as in training), against the bfloat16 matmul those projections run without FP8;
  forward, and the gradients of both operands.

Errors: the largest absolute difference, and the relative error ``||got - want|| / ||want||``
(Frobenius norms; for gradients the largest of the tensors compared). A row passes when its
relative error is within its tolerance: for attention the dtype's machine epsilon (forward)
or twice it (gradients), for FP8 half the epsilon of e4m3 (forward) or of e5m2 (gradients,
whose output gradient is rounded to e5m2); ``tolerance_scale`` multiplies them all.

Everything here runs on any platform JAX has, except cuDNN (GPUs only): on a CPU the XLA rows
run (float16 ones excepted: XLA's CPU dot takes no float16 operands accumulating in float32)
and the FP8 rows run with XLA computing FP8's rounding in wider types.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax.linen import fp8_ops

from pax_core import Backend
from pax_gpu.backends import cudnn_attention, cudnn_unsupported, fp8_unsupported, segment_mask

PASS, FAIL, SKIPPED = "pass", "FAIL", "skipped"
# A projection's contraction: the last axis of x with the first of the kernel.
MATMUL_DIMS = (((1,), (0,)), ((), ()))
_FP8 = fp8_ops.Fp8DirectDotGeneralOp(amax_history_length=16)


@dataclasses.dataclass(frozen=True)
class AttentionCase:
    """One attention shape: query [batch, length, heads, head_dim], keys and values with
    ``kv_heads`` heads; causal or not, with packed segments or not."""

    label: str
    batch: int
    length: int
    heads: int
    kv_heads: int
    head_dim: int
    causal: bool
    packed: bool
    dtype: str

    @property
    def shape(self) -> str:
        kv = f", {self.kv_heads} kv heads" if self.kv_heads != self.heads else ""
        return f"{self.batch}x{self.length}x{self.heads}x{self.head_dim}{kv}"


ATTENTION_CASES = (
    AttentionCase("no mask", 2, 256, 8, 8, 64, causal=False, packed=False, dtype="bfloat16"),
    AttentionCase("causal", 2, 256, 8, 8, 128, causal=True, packed=False, dtype="bfloat16"),
    AttentionCase("causal, packed segments", 2, 256, 8, 8, 64, causal=True, packed=True,
                  dtype="bfloat16"),
    AttentionCase("causal, grouped kv heads", 2, 256, 8, 2, 64, causal=True, packed=False,
                  dtype="bfloat16"),
    AttentionCase("causal", 2, 256, 8, 8, 64, causal=True, packed=False, dtype="float16"),
)
# [M, K] x [K, N]: a projection's activations and weights.
MATMUL_SHAPES = ((256, 1024, 1024), (512, 2048, 512))


@dataclasses.dataclass
class Row:
    """One line of the table: what was compared, how far apart, and the verdict."""

    check: str
    shape: str
    dtype: str
    tolerance: float
    max_abs: float | None = None
    relative: float | None = None
    status: str = SKIPPED
    note: str = ""


def attention_tolerance(dtype: Any, gradients: bool) -> float:
    """The dtype's machine epsilon for the output, twice it for the gradients."""
    return float(jnp.finfo(dtype).eps) * (2 if gradients else 1)


FP8_FORWARD_TOLERANCE = float(jnp.finfo(jnp.float8_e4m3fn).eps) / 2
FP8_GRADIENT_TOLERANCE = float(jnp.finfo(jnp.float8_e5m2).eps) / 2


def measure(got: Sequence[Any], want: Sequence[Any]) -> tuple[float, float]:
    """(largest absolute difference, largest relative Frobenius error) over pairs of arrays."""
    max_abs, relative = 0.0, 0.0
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        max_abs = max(max_abs, float(np.max(np.abs(g - w))))
        relative = max(relative, float(np.linalg.norm(g - w) / np.linalg.norm(w)))
    return max_abs, relative


def compare(row: Row, got: Sequence[Any], want: Sequence[Any]) -> Row:
    """``row`` with the errors of ``got`` against ``want`` and its verdict (NaN fails)."""
    row.max_abs, row.relative = measure(got, want)
    row.status = PASS if row.relative <= row.tolerance else FAIL
    return row


def full_mask(length: int, causal: bool, segment_ids: jax.Array | None) -> jax.Array | None:
    """The boolean mask the transformer builds: causal, within packed segments, or both."""
    mask = jnp.tril(jnp.ones((length, length), bool))[None, None] if causal else None
    if segment_ids is not None:
        segments = segment_mask(segment_ids)
        mask = segments if mask is None else mask & segments
    return mask


def _attend(query: jax.Array, key: jax.Array, value: jax.Array, segment_ids: jax.Array | None,
            *, is_causal: bool, implementation: str) -> jax.Array:
    if implementation == "cudnn":
        return cudnn_attention(query, key, value, is_causal=is_causal, segment_ids=segment_ids)
    mask = full_mask(query.shape[1], is_causal, segment_ids)
    return Backend().attention(query, key, value, mask=mask, is_causal=is_causal,
                               segment_ids=segment_ids)


@functools.partial(jax.jit, static_argnames=("is_causal", "implementation"))
def attention_and_gradients(query: jax.Array, key: jax.Array, value: jax.Array,
                            segment_ids: jax.Array | None, cotangent: jax.Array, *,
                            is_causal: bool, implementation: str) -> tuple[jax.Array, tuple]:
    """The attention output and (dQ, dK, dV) for the output gradient ``cotangent``."""
    attend = functools.partial(_attend, segment_ids=segment_ids, is_causal=is_causal,
                               implementation=implementation)
    out, pullback = jax.vjp(attend, query, key, value)
    return out, pullback(cotangent.astype(out.dtype))


def attention_inputs(case: AttentionCase, seed: int = 0) -> tuple[jax.Array, ...]:
    """query, key, value and an output gradient of ``case``'s dtype, N(0, 1); the packed
    segment ids (two segments in one row, three in the other) or None."""
    dtype = jnp.dtype(case.dtype)
    keys = jax.random.split(jax.random.key(seed), 4)
    b, t, h = case.batch, case.length, case.head_dim
    query = jax.random.normal(keys[0], (b, t, case.heads, h), dtype)
    key = jax.random.normal(keys[1], (b, t, case.kv_heads, h), dtype)
    value = jax.random.normal(keys[2], (b, t, case.kv_heads, h), dtype)
    cotangent = jax.random.normal(keys[3], (b, t, case.heads, h), dtype)
    segment_ids = None
    if case.packed:
        splits = ([t * 3 // 8, t - t * 3 // 8], [t // 4, t // 4, t // 2])
        rows = [np.repeat(np.arange(1, len(s) + 1), s) for s in splits]
        segment_ids = jnp.asarray(np.stack([rows[i % 2] for i in range(b)]), jnp.int32)
    return query, key, value, cotangent, segment_ids


def attention_rows(device: jax.Device, case: AttentionCase,
                   tolerance_scale: float = 1.0) -> list[Row]:
    """XLA's and cuDNN's attention of ``case``, forward and gradients, against float32."""
    query, key, value, cotangent, segment_ids = attention_inputs(case)
    mask = full_mask(case.length, case.causal, segment_ids)
    rows, want = [], None
    for name, implementation in (("XLA", "xla"), ("cuDNN", "cudnn")):
        forward, backward = (Row(f"{name} attention {part}, {case.label}", case.shape,
                                 case.dtype, tolerance_scale * attention_tolerance(
                                     case.dtype, part == "gradients"))
                             for part in ("forward", "gradients"))
        rows += [forward, backward]
        if implementation == "cudnn":
            reason = (f"cuDNN runs on NVIDIA GPUs, not {device.platform}"
                      if device.platform != "gpu" else
                      cudnn_unsupported(query, key, mask=mask, is_causal=case.causal,
                                        segment_ids=segment_ids))
        else:
            reason = ("XLA's CPU dot takes no float16 operands accumulating in float32"
                      if device.platform == "cpu" and case.dtype == "float16" else None)
        if reason is not None:
            forward.note = backward.note = reason
            continue
        if want is None:
            want = reference_attention(query, key, value, segment_ids, cotangent, case.causal)
        try:
            out, grads = attention_and_gradients(query, key, value, segment_ids, cotangent,
                                                 is_causal=case.causal,
                                                 implementation=implementation)
        except Exception as e:  # a kernel this machine cannot run is the finding to report
            forward.status = backward.status = FAIL
            forward.note = backward.note = str(e).strip().splitlines()[0][:200]
            continue
        compare(forward, [out], [want[0]])
        compare(backward, grads, want[1])
    return rows


def reference_attention(query: jax.Array, key: jax.Array, value: jax.Array,
                        segment_ids: jax.Array | None, cotangent: jax.Array,
                        is_causal: bool) -> tuple[jax.Array, tuple]:
    """XLA's attention and its gradients in float32 at the highest matmul precision (no TF32
    on GPUs), from the same rounded inputs: what both paths are measured against."""
    wide = [x.astype(jnp.float32) for x in (query, key, value, cotangent)]
    with jax.default_matmul_precision("highest"):
        return attention_and_gradients(*wide[:3], segment_ids, wide[3], is_causal=is_causal,
                                       implementation="xla")


def _fp8_loss(variables: Any, x: jax.Array, w: jax.Array, cotangent: jax.Array) -> jax.Array:
    y = _FP8.apply(variables, x, w, MATMUL_DIMS)
    return jnp.sum(y.astype(jnp.float32) * cotangent.astype(jnp.float32))


# The gradient of the FP8 state is its next value (Flax's overwrite-with-gradient collection):
# one step puts this step's largest magnitudes into the histories the scales come from.
_fp8_next_state = jax.jit(jax.grad(_fp8_loss))


@jax.jit
def fp8_and_gradients(variables: Any, x: jax.Array, w: jax.Array,
                      cotangent: jax.Array) -> tuple[jax.Array, tuple]:
    """The FP8 product and the gradients of x and w for the output gradient ``cotangent``."""
    y, pullback = jax.vjp(lambda a, b: _FP8.apply(variables, a, b, MATMUL_DIMS), x, w)
    return y, pullback(cotangent)


@jax.jit
def matmul_and_gradients(x: jax.Array, w: jax.Array,
                         cotangent: jax.Array) -> tuple[jax.Array, tuple]:
    """The same in the projections' own dtype: what FP8 replaces."""
    y, pullback = jax.vjp(lambda a, b: jnp.tensordot(a, b, axes=1), x, w)
    return y, pullback(cotangent)


def fp8_rows(device: jax.Device, shape: tuple[int, int, int],
             tolerance_scale: float = 1.0) -> list[Row]:
    """The FP8 matmul of [M, K] x [K, N] bfloat16 operands against the bfloat16 one."""
    m, k, n = shape
    label = f"{m}x{k} @ {k}x{n}"
    forward = Row("FP8 matmul forward (delayed scaling)", label, "e4m3 vs bfloat16",
                  tolerance_scale * FP8_FORWARD_TOLERANCE)
    backward = Row("FP8 matmul gradients (delayed scaling)", label,
                   "e5m2 x e4m3 vs bfloat16", tolerance_scale * FP8_GRADIENT_TOLERANCE)
    reason = (fp8_unsupported(getattr(device, "compute_capability", ""))
              if device.platform == "gpu" else None)
    if reason is not None:
        forward.note = backward.note = f"this GPU has {reason}"
        return [forward, backward]
    keys = jax.random.split(jax.random.key(1), 4)
    x = jax.random.normal(keys[0], (m, k), jnp.bfloat16)
    w = (jax.random.normal(keys[1], (k, n)) / np.sqrt(k)).astype(jnp.bfloat16)
    cotangent = jax.random.normal(keys[2], (m, n), jnp.bfloat16)
    try:
        variables = _FP8.init(keys[3], x, w, MATMUL_DIMS)
        variables = _fp8_next_state(variables, x, w, cotangent)
        y, grads = fp8_and_gradients(variables, x, w, cotangent)
    except Exception as e:  # as for attention: what fails to run here is the finding
        forward.status = backward.status = FAIL
        forward.note = backward.note = str(e).strip().splitlines()[0][:200]
        return [forward, backward]
    want_y, want_grads = matmul_and_gradients(x, w, cotangent)
    if device.platform != "gpu":
        forward.note = backward.note = f"XLA emulates FP8 on {device.platform}"
    return [compare(forward, [y], [want_y]), compare(backward, grads, want_grads)]


def run_checks(device: jax.Device, tolerance_scale: float = 1.0) -> list[Row]:
    """Every row of ``pax gpu check``, computed on ``device``."""
    rows = []
    with jax.default_device(device):
        for case in ATTENTION_CASES:
            rows += attention_rows(device, case, tolerance_scale)
        for shape in MATMUL_SHAPES:
            rows += fp8_rows(device, shape, tolerance_scale)
    return rows


def exit_code(rows: Sequence[Row]) -> int:
    """0 when no row failed (skipped ones do not count), else 1."""
    return 1 if any(r.status == FAIL for r in rows) else 0
