"""A feed-forward of the test's own, given to the transformer blocks through their slot: it
trains, and `pax plan` counts its weights and FLOPs from the part, with no edit of the block,
the stack, the parameter count or the FLOP formula."""

from __future__ import annotations

import types
from typing import Any

import fiddle as fdl
import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.typing import Initializer

from pax_core import ExperimentRef, axes, hookimpl
from pax_core.testing import first_batch_losses, going_down, plan, register_plugin
from pax_lm import TinyLmForTests

EXPERTS = 2


class TwoExpertFeedForward(nn.Module):
    """Two experts and a router; each token goes through the expert the router scores highest,
    scaled by that score. The block fills the fields it owns (widths, initializer, dtypes);
    ``gated``, ``use_bias`` and FP8, which this part does not declare, are not given."""

    hidden_dims: int
    kernel_init: Initializer
    activation: str = "relu"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.nowrap
    def num_weights(self, model_dims: int) -> int:
        return model_dims * EXPERTS + EXPERTS * 2 * model_dims * self.hidden_dims

    @nn.nowrap
    def train_flops_per_token(self, model_dims: int, seq_len: int) -> float:
        del seq_len
        return 6.0 * (model_dims * EXPERTS + 2 * model_dims * self.hidden_dims)  # one expert

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        d = x.shape[-1]

        def param(name: str, shape: tuple[int, ...], names: tuple[str | None, ...]) -> jax.Array:
            init = nn.with_logical_partitioning(self.kernel_init, names)
            return self.param(name, init, shape, self.param_dtype).astype(self.dtype)

        router = param("router", (d, EXPERTS), (axes.EMBED, None))
        wi = param("wi", (EXPERTS, d, self.hidden_dims), (None, axes.EMBED, axes.MLP))
        wo = param("wo", (EXPERTS, self.hidden_dims, d), (None, axes.MLP, axes.EMBED))
        scores = jax.nn.softmax(jnp.einsum("bld,de->ble", x, router).astype(jnp.float32))
        choice = jax.nn.one_hot(jnp.argmax(scores, -1), EXPERTS) * scores
        hidden = getattr(nn, self.activation)(jnp.einsum("bld,edf->blef", x, wi))
        out = jnp.einsum("blef,efd->bled", hidden, wo)
        return jnp.einsum("bled,ble->bld", out, choice.astype(self.dtype))


class TinyLmTwoExperts(TinyLmForTests):
    """The tests' tiny LM with ``TwoExpertFeedForward`` in every block."""

    def decoder(self) -> fdl.Config:
        config = super().decoder()
        config.feed_forward = fdl.Partial(TwoExpertFeedForward)
        return config


PLUGIN = types.ModuleType("parts")
PLUGIN.pax_register_experiments = hookimpl(lambda: [ExperimentRef(
    "TinyLmTwoExperts", f"{__name__}:TinyLmTwoExperts")])


def test_a_feed_forward_given_through_the_slot_trains_and_is_planned(pax_host):
    with register_plugin(pax_host, PLUGIN, "parts"):
        losses = first_batch_losses(pax_host, "TinyLmTwoExperts", "parts",
                                    ["LR_SCHEDULE=constant", "LEARNING_RATE=3e-3"], steps=8)
        report = plan(pax_host, exp="TinyLmTwoExperts", plugin="parts", set_items=[])
    assert going_down(losses), losses
    # TinyLmForTests: 2 layers of width 64 (4 heads of 16), feed-forward 256, 259 tokens tied,
    # layer norms (scale and bias), rows of 32.
    d, f, vocab, layers, seq = 64, 256, 259, 2, 32
    block_outside_ffn = 2 * 2 * d + 4 * d * d  # two norms and attention's projections
    ffn_held = d * EXPERTS + EXPERTS * 2 * d * f
    assert report.params == vocab * d + 2 * d + layers * (block_outside_ffn + ffn_held)
    ffn_used = d * EXPERTS + 2 * d * f
    per_token = (6 * (2 * d + vocab * d + layers * (block_outside_ffn + ffn_used))
                 + 12 * layers * 4 * 16 * seq)
    assert report.model_flops_per_token == per_token
