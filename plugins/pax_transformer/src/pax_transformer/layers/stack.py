"""The layer stack: a Python loop of blocks, or ``nn.scan`` over one repeated block.

Looped layers are named ``layer_0 .. layer_{n-1}``; the scanned stack is one module ``layers``
whose every weight (and cache entry, and FP8 scale and history) has a leading axis of size
``num_layers``, named ``"layers"`` for the partitioner. Scanning traces and compiles one block
instead of n, which pays off with depth; the two give the same function of the same weights
(``stack_layer_params`` converts one layout into the other).

With ``remat_policy`` each block is wrapped in ``nn.remat`` with that policy.

With ``global_every`` > 0 the blocks differ (sliding or global attention): each is called with
its layer index, a Python int in the loop and, in the scan, a scanned input ``arange(n)`` (so
the one traced block computes every layer's window and rotary frequencies from data).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen.fp8_ops import OVERWRITE_WITH_GRADIENT

from pax_core import axes
from pax_transformer.layers.block import BlockConfig, TransformerBlock
from pax_transformer.layers.remat import remat_policy


class TransformerStack(nn.Module):
    """``num_layers`` transformer blocks applied in order to [B, L, d] activations."""

    config: BlockConfig
    num_layers: int
    scan_layers: bool = False
    remat_policy: str | None = None
    train: bool = False
    decode: bool = False

    @nn.compact
    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        segment_ids: jax.Array | None = None,
        decode_start: jax.Array | None = None,
    ) -> jax.Array:
        block: Any = TransformerBlock
        if self.remat_policy is not None:
            # Under scan, CSE across iterations cannot undo the remat, so prevent_cse is off.
            block = nn.remat(
                block, policy=remat_policy(self.remat_policy), prevent_cse=not self.scan_layers
            )
        per_layer = self.config.global_every > 0
        if self.scan_layers:
            block = nn.scan(
                block,
                variable_axes={"params": 0, "cache": 0, OVERWRITE_WITH_GRADIENT: 0},
                split_rngs={"params": True, "dropout": True},
                in_axes=(nn.broadcast, nn.broadcast, nn.broadcast) + ((0,) if per_layer else ()),
                length=self.num_layers,
                metadata_params={nn.PARTITION_NAME: axes.LAYERS},
            )
            layers = (jnp.arange(self.num_layers),) if per_layer else ()
            x, _ = block(self.config, self.train, self.decode, name="layers")(
                x, positions, segment_ids, decode_start, *layers
            )
            return x
        for i in range(self.num_layers):
            x, _ = block(self.config, self.train, self.decode, name=f"layer_{i}")(
                x, positions, segment_ids, decode_start, *((i,) if per_layer else ())
            )
        return x


def stack_layer_params(stack: Mapping[str, Any]) -> dict[str, Any]:
    """Looped stack weights ``{"layer_0": t0, "layer_1": t1, ...}`` -> scanned ``{"layers": t}``.

    Works on plain arrays (``nn.unbox`` boxed values first), for params or a cache alike; every
    leaf of ``t`` is the layers' leaves stacked on a new leading axis.
    """
    names = [f"layer_{i}" for i in range(len(stack))]
    if set(stack) != set(names):
        raise ValueError(f"expected looped layers {names}, got {sorted(stack)}")
    layers = [stack[name] for name in names]
    return {"layers": jax.tree.map(lambda *leaves: jnp.stack(leaves), *layers)}
