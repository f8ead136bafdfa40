"""The position-wise feed-forward block, plain or gated (GLU family).

Plain: ``wo(act(wi(x)))``. Gated, as in Pax: ``wo(act(wi_gate(x)) * wi(x))``, so SwiGLU is
``activation="silu", gated=True`` and GeGLU is ``activation="gelu", gated=True``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.typing import Initializer

from pax_core import axes
from pax_transformer.layers.dense import Projection
from pax_transformer.layers.lora import Lora
from pax_transformer.layers.validation import check_choice

# Logical axes of the input and output kernels.
IN_AXES = (axes.EMBED, axes.MLP)
OUT_AXES = (axes.MLP, axes.EMBED)
PATH = "ffn"  # the part's name in a block: its projections' paths for LoRA targets

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": nn.relu,
    "gelu": functools.partial(nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(nn.gelu, approximate=True),
    "silu": nn.silu,
}


class FeedForward(nn.Module):
    """[B, L, d] -> [B, L, d] through ``hidden_dims`` units.

    Kernels: ``wi`` (and ``wi_gate``) [d, hidden_dims] ("embed", "mlp"), ``wo`` [hidden_dims, d]
    ("mlp", "embed"); with ``use_bias`` a bias on each. ``fp8_amax_history`` > 0 runs the
    three matmuls in FP8 (``Projection``). ``lora`` puts low-rank adapters on the
    projections it targets (``ffn/wi``, ``ffn/wi_gate``, ``ffn/wo``), their dropout active when
    ``train``.
    """

    hidden_dims: int
    kernel_init: Initializer
    activation: str = "relu"
    gated: bool = False
    use_bias: bool = False
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    fp8_amax_history: int = 0
    lora: Lora | None = None
    train: bool = False

    @nn.nowrap
    def num_weights(self, model_dims: int) -> int:
        """``wi`` (and ``wi_gate``) and ``wo``, with their biases and adapters."""
        d, f, b = model_dims, self.hidden_dims, int(self.use_bias)
        adapters = sum(self.lora.rank * (d + f) for name in self.projections()
                       if self._adapter(name)) if self.lora else 0
        return (2 if self.gated else 1) * (d + b) * f + (f + b) * d + adapters

    @nn.nowrap
    def projections(self) -> tuple[str, ...]:
        """The projections' names."""
        return ("wi", "wi_gate", "wo") if self.gated else ("wi", "wo")

    @nn.nowrap
    def _adapter(self, name: str) -> Lora | None:
        """The adapter of projection ``name``, if ``lora`` targets it."""
        return self.lora if self.lora and self.lora.adapts(f"{PATH}/{name}") else None

    @nn.nowrap
    def train_flops_per_token(self, model_dims: int, seq_len: int) -> float:
        """6 per weight: every token multiplies them all."""
        del seq_len
        return float(6 * self.num_weights(model_dims))

    def _dense(self, features: int, names: tuple[str, str], name: str) -> Projection:
        return Projection(
            (features,), names[:1], names[1:], self.kernel_init, self.use_bias, self.dtype,
            self.param_dtype, self.fp8_amax_history, self._adapter(name), self.train, name=name,
        )

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        check_choice("activation", self.activation, ACTIVATIONS)
        act = ACTIVATIONS[self.activation]
        hidden = self._dense(self.hidden_dims, IN_AXES, "wi")(x)
        if self.gated:
            hidden = act(self._dense(self.hidden_dims, IN_AXES, "wi_gate")(x)) * hidden
        else:
            hidden = act(hidden)
        hidden = nn.with_logical_constraint(hidden, (axes.BATCH, axes.LENGTH, axes.MLP))
        return self._dense(x.shape[-1], OUT_AXES, "wo")(hidden)
