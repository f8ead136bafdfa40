"""A multi-axis dense projection whose weights carry logical axis names.

Why not ``flax.linen.DenseGeneral``: it calls the initialiser with a flattened 2-D shape and
reshapes afterwards, so a logically partitioned initialiser sees 3 axis names on a 2-D value;
under axis rules and a mesh (and flax re-evaluates initialisers abstractly on every ``apply`` to
check shapes) that fails. Here the initialiser still sees the 2-D [fan_in, fan_out] shape (so
fan-in scaling counts every contracted axis) but the names are attached to the final shape.

FP8 (``fp8_amax_history`` > 0) is Flax's delayed scaling (``Fp8DirectDotGeneralOp``): inputs
and kernel are cast to e4m3 and the output gradient to e5m2, each scaled by the largest
magnitude seen over the last ``fp8_amax_history`` steps; the scales and histories are
variables of the ``_overwrite_with_gradient`` collection, which the train step replaces by
their gradients (the op's backward pass returns their next values there).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import fp8_ops
from flax.typing import Initializer

from pax_transformer.layers.initializers import partitioned
from pax_transformer.layers.lora import Lora


def _reshaped(init: Initializer, contracted: int) -> Initializer:
    """``init`` applied to the [prod(in axes), prod(out axes)] matrix, reshaped to ``shape``."""

    def wrapped(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        flat = (math.prod(shape[:contracted]), math.prod(shape[contracted:]))
        return jnp.reshape(init(key, flat, dtype), shape)

    return wrapped


class Projection(nn.Module):
    """Contract the last ``len(in_names)`` axes of x with a kernel, giving ``features`` axes.

    The kernel is [*x.shape[-len(in_names):], *features] named ``(*in_names, *out_names)``;
    with ``use_bias`` a bias of shape ``features`` named ``out_names``. Computed in ``dtype``,
    or in FP8 with delayed scaling over ``fp8_amax_history`` steps when that is above 0. With
    ``lora`` a low-rank adapter beside the kernel (``lora_a``, ``lora_b``; ``layers/lora.py``),
    its dropout active when ``train``.
    """

    features: tuple[int, ...]
    in_names: tuple[str, ...]
    out_names: tuple[str, ...]
    kernel_init: Initializer
    use_bias: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    fp8_amax_history: int = 0
    lora: Lora | None = None
    train: bool = False

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        contracted = len(self.in_names)
        kernel = self.param(
            "kernel",
            partitioned(_reshaped(self.kernel_init, contracted), self.in_names + self.out_names),
            (*x.shape[x.ndim - contracted :], *self.features),
            self.param_dtype,
        )
        x, kernel = x.astype(self.dtype), kernel.astype(self.dtype)
        if self.fp8_amax_history:
            dims = ((tuple(range(x.ndim - contracted, x.ndim)), tuple(range(contracted))), ((), ()))
            fp8 = fp8_ops.Fp8DirectDotGeneralOp(amax_history_length=self.fp8_amax_history,
                                                name="fp8")
            y = fp8(x, kernel, dims)
        else:
            y = jnp.tensordot(x, kernel, axes=contracted)
        if self.use_bias:
            bias = self.param(
                "bias", partitioned(nn.initializers.zeros, self.out_names), self.features,
                self.param_dtype,
            )
            y = y + bias.astype(self.dtype)
        if self.lora is not None:
            y = y + self._adapter(x)
        return y

    def _adapter(self, x: jax.Array) -> jax.Array:
        """The low-rank update ``scale * dropout(x) A B`` (``layers/lora.py``)."""
        contracted, rank = len(self.in_names), self.lora.rank
        a_init = _reshaped(nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform"),
                           contracted)
        a = self.param("lora_a", partitioned(a_init, (*self.in_names, None)),
                       (*x.shape[x.ndim - contracted:], rank), self.param_dtype)
        b = self.param("lora_b", partitioned(nn.initializers.zeros, (None, *self.out_names)),
                       (rank, *self.features), self.param_dtype)
        x = nn.Dropout(self.lora.dropout, deterministic=not self.train)(x)
        low = jnp.tensordot(x, a.astype(self.dtype), axes=contracted)
        return jnp.tensordot(low, b.astype(self.dtype), axes=1) * self.lora.scale
