"""The layer stack: a Python loop of blocks, or ``nn.scan`` over one repeated block.

Looped layers are named ``layer_0 .. layer_{n-1}``; the scanned stack is one module ``layers``
whose every weight (and cache entry, and FP8 scale and history) has a leading axis of size
``num_layers``, named ``"layers"`` for the partitioner. Where dense and sparse layers
alternate (``BlockConfig.moe_every``, ``first_dense_layers``), the scanned stack holds the
dense first layers as ``dense_layers`` (scanned the same way) and then repeats a
``BlockGroup`` of ``moe_every`` blocks (``layers/block_0`` .. ``layers/block_{k-1}``, the last
one sparse) ``(num_layers - first_dense_layers) / moe_every`` times. Scanning traces and
compiles one block (or group) instead of n, which pays off with depth; the two give the same
function of the same weights (``stack_layer_params`` converts the looped layout of uniform
layers into the scanned one).

With ``remat_policy`` each block is wrapped in ``nn.remat`` with that policy.

The stack returns ``(x, stats)``: the stats its blocks' sparse feed-forward parts reported
(``layers/moe.py``), each stacked on a leading axis of one entry per layer; ``{}`` when every
layer is dense.

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
from pax_transformer.layers.parts import PartStats
from pax_transformer.layers.remat import remat_policy


class BlockGroup(nn.Module):
    """``config.moe_every`` blocks, the last one sparse: the unit a scanned stack repeats when
    dense and sparse layers alternate. Its blocks are ``block_0`` .. ``block_{k-1}``."""

    config: BlockConfig
    block: Any
    train: bool = False
    decode: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None,
                 decode_start: jax.Array | None, layers: jax.Array | None = None
                 ) -> tuple[jax.Array, PartStats | None]:
        size = self.config.moe_every
        dense = self.config.layer_config(0)  # the group starts past any dense first layers
        stats = None
        for j in range(size):
            config = self.config if j == size - 1 else dense
            x, stats = self.block(config, self.train, self.decode, name=f"block_{j}")(
                x, positions, segment_ids, decode_start,
                *(() if layers is None else (layers[j],)))
        return x, stats


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
    ) -> tuple[jax.Array, PartStats]:
        block: Any = TransformerBlock
        if self.remat_policy is not None:
            # Under scan, CSE across iterations cannot undo the remat, so prevent_cse is off.
            block = nn.remat(
                block, policy=remat_policy(self.remat_policy), prevent_cse=not self.scan_layers
            )
        args = (x, positions, segment_ids, decode_start)
        if self.scan_layers:
            return self._scanned(block, *args)
        per_layer = self.config.global_every > 0
        reported = []
        for i in range(self.num_layers):
            x, stats = block(self.config.layer_config(i), self.train, self.decode,
                             name=f"layer_{i}")(x, *args[1:], *((i,) if per_layer else ()))
            reported.append(stats)
        return x, _stacked([stats for stats in reported if stats is not None])

    def _scanned(self, block: Any, x: jax.Array, *args: Any) -> tuple[jax.Array, PartStats]:
        """The layers as ``nn.scan`` over one block, or over a ``BlockGroup`` when dense and
        sparse layers alternate, after the dense first layers' own scan."""
        c = self.config
        first = c.first_dense_layers
        if first:
            x, _ = self._scan(block, first, "dense_layers", c.layer_config(0))(
                x, *args, *self._indices(0, first))
        repeats = (self.num_layers - first) // c.moe_every
        if c.moe_every == 1:
            unit, indices = self._scan(block, repeats, "layers", c), self._indices(first, repeats)
        else:
            unit = self._scan(BlockGroup, repeats, "layers", c, block)
            indices = tuple(i.reshape(repeats, c.moe_every)
                            for i in self._indices(first, self.num_layers - first))
        x, stats = unit(x, *args, *indices)
        return x, stats or {}

    def _indices(self, start: int, count: int) -> tuple[jax.Array, ...]:
        """The scanned layers' indices, which the blocks take with ``global_every`` > 0."""
        return (start + jnp.arange(count),) if self.config.global_every else ()

    def _scan(self, unit: Any, length: int, name: str, *fields: Any) -> nn.Module:
        """``unit`` (a module class, made with ``fields``) repeated ``length`` times."""
        scanned = nn.scan(
            unit,
            variable_axes={"params": 0, "cache": 0, OVERWRITE_WITH_GRADIENT: 0},
            split_rngs={"params": True, "dropout": True},
            in_axes=(nn.broadcast, nn.broadcast, nn.broadcast)
            + ((0,) if self.config.global_every else ()),
            length=length,
            metadata_params={nn.PARTITION_NAME: axes.LAYERS},
        )
        return scanned(*fields, train=self.train, decode=self.decode, name=name)


def _stacked(reported: list[PartStats]) -> PartStats:
    """The sparse layers' stats, each stacked on a leading layers axis."""
    return jax.tree.map(lambda *layers: jnp.stack(layers), *reported) if reported else {}


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
