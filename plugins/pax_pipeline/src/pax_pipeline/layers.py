"""The pipelined transformer stack: pax-transformer's layers, run as a pipeline over stages.

``Pipeline`` is the value an experiment puts in ``TransformerLm.stack``; the model calls it as
it would build its own stack, and gets a ``PipelinedStack``. The weights are stored as a
scanned stack stores them, ``stack/layers/...`` with a leading ``[L]`` dimension named
``layers`` (GPipe; the very layout of an unpipelined ``USE_REPEATED_LAYER`` model, so a
checkpoint moves between the two as it is) or ``[R, L / R]`` (circular), and the pipeline
partitioner maps ``layers`` onto the ``stage`` mesh axis.

Inside a stage the layers see the experiment's axis rules without the stage mesh axes (the
stage dimension already holds them), so ``batch`` shards over what remains (replica, data)
and the model's own constraints keep working per stage.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from pax_core import axes
from pax_pipeline import schedule as sched
from pax_transformer import BlockConfig, TransformerStack


@dataclasses.dataclass(frozen=True)
class Pipeline(sched.Schedule):
    """A pipeline schedule that builds the layer stack of a ``TransformerLm``:
    ``TransformerLm(..., stack=Pipeline(num_stages=4, microbatch_size=2))``."""

    def __call__(self, config: BlockConfig, num_layers: int, scan_layers: bool = False,
                 remat_policy: str | None = None, train: bool = False, decode: bool = False,
                 *, name: str | None = None) -> PipelinedStack:
        del scan_layers  # a pipeline's stages are always scanned stacks
        return PipelinedStack(config, num_layers, self, remat_policy, train, decode, name=name)


def _stage_rules(rules: tuple, stage_axes: tuple[str, ...]) -> tuple:
    """The axis rules without the mesh axes the stage dimension takes."""
    def strip(target: Any) -> Any:
        if isinstance(target, tuple | list):
            kept = tuple(a for a in target if a not in stage_axes)
            return kept or None
        return None if target in stage_axes else target

    return tuple((name, strip(target)) for name, target in rules)


def _mesh_axes(logical: str) -> tuple[str, ...]:
    """The mesh axes the rules in context give ``logical`` (none outside a partitioner)."""
    if not nn.get_logical_axis_rules():
        return ()
    target = nn.logical_to_mesh_axes((logical,))[0]
    if target is None:
        return ()
    return tuple(target) if isinstance(target, tuple) else (target,)


class PipelinedStack(nn.Module):
    """``num_layers`` transformer blocks run as a pipeline; the same function as the stack."""

    config: BlockConfig
    num_layers: int
    schedule: sched.Schedule
    remat_policy: str | None = None
    train: bool = False
    decode: bool = False

    def _body(self, num_layers: int, train: bool, decode: bool = False) -> TransformerStack:
        return TransformerStack(self.config, num_layers, scan_layers=True,
                                remat_policy=self.remat_policy, train=train, decode=decode,
                                parent=None)

    def _init_layers(self, rng: jax.Array, x: jax.Array, positions: jax.Array,
                     segment_ids: jax.Array | None) -> Any:
        """The scanned stack's boxed weights, reshaped to the stored layout (``to_stages``)."""
        boxed = self._body(self.num_layers, False).init({"params": rng}, x[:1], positions[:1],
                                                        None if segment_ids is None
                                                        else segment_ids[:1])
        layers = boxed["params"]["layers"]
        if self.schedule.circular_repeat == 1:
            return layers
        shape = sched.stored_shape(self.num_layers, self.schedule)

        def regroup(box: nn.Partitioned) -> nn.Partitioned:
            value = box.value.reshape(*shape, *box.value.shape[1:])
            return box.replace(value=value, names=(None, *box.names))

        return jax.tree.map(regroup, layers, is_leaf=lambda b: isinstance(b, nn.Partitioned))

    @nn.compact
    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None = None,
                 decode_start: jax.Array | None = None
                 ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The stack's ``(x, stats)``: the sparse layers' routing stats, each layer's averaged
        over the microbatches (``{}`` for dense layers)."""
        s = self.schedule
        s.check(self.num_layers)
        layers = self.param("layers", self._init_layers, x, positions, segment_ids)
        if self.decode:
            return self._decode(layers, x, positions, decode_start), {}
        count = s.microbatches(x.shape[0])
        positions = jnp.broadcast_to(positions, x.shape[:2])  # [1, L] shared: a row each

        per_group = self.num_layers // s.num_groups
        body = self._body(per_group, self.train)
        train = self.train and self.config.dropout_rate > 0

        def stage_fn(params, h, aux, group, rng):
            group_params = jax.tree.map(
                lambda w: jax.lax.dynamic_slice_in_dim(w, group * per_group, per_group, 0),
                params)
            segments = aux[1] if len(aux) > 1 else None
            h, stats = body.apply({"params": {"layers": group_params}}, h, aux[0], segments,
                                  None, rngs={"dropout": rng} if train else None)
            # Each pass's layers keep their own stats: [R, layers a pass runs, ...].
            return h, jax.tree.map(
                lambda v: jnp.zeros((s.circular_repeat, *v.shape), v.dtype).at[group].set(v),
                stats)

        rules = nn.get_logical_axis_rules()
        stage_axes = _mesh_axes(axes.STAGES)
        inner = _stage_rules(rules, stage_axes)
        activation = (axes.BATCH, axes.LENGTH, axes.EMBED)
        io_axes = (axes.STAGES if s.stream_io else None, *activation)
        rng = self.make_rng("dropout") if train else jax.random.PRNGKey(0)
        with nn.logical_axis_rules(inner):
            aux = tuple(_split(a, count) for a in (positions, segment_ids) if a is not None)
            out, stats = sched.run(
                stage_fn, sched.to_stages(layers, s), _split(x, count), aux, s, rng=rng,
                spmd_axis_name=stage_axes or None,
                constrain_state=_constrain((axes.STAGES, *activation), rules),
                constrain_io=_constrain(io_axes, rules if s.stream_io else inner))
        # [S, R, layers a pass runs, ...] (each pass's slot filled by its share of the
        # stage's computations) -> one entry per layer, in the layers' order: pass by pass,
        # stage by stage.
        stats = jax.tree.map(lambda v: (v * s.circular_repeat).swapaxes(0, 1).reshape(
            -1, *v.shape[3:]), stats)
        return nn.with_logical_constraint(_join(out), activation), stats

    def _decode(self, layers: Any, x: jax.Array, positions: jax.Array,
                decode_start: jax.Array | None) -> jax.Array:
        """Decoding feeds a few tokens at a time, nothing worth pipelining: the weights run as
        the unpipelined scanned stack (circular ones seen as ``[L]``), with its KV cache at the
        scanned stack's place in the ``cache`` collection."""
        body = self._body(self.num_layers, self.train, decode=True)
        cache = self.variable("cache", "layers", lambda: body.init(
            jax.random.PRNGKey(0), x, positions, None, decode_start)["cache"]["layers"])
        leading = len(sched.stored_shape(self.num_layers, self.schedule))
        flat = jax.tree.map(lambda w: w.reshape(self.num_layers, *w.shape[leading:]), layers)
        (out, _), mutated = body.apply(
            {"params": {"layers": flat}, "cache": {"layers": cache.value}}, x, positions, None,
            decode_start, mutable=["cache"])
        if not self.is_initializing():
            cache.value = mutated["cache"]["layers"]
        return out



def _constrain(names: tuple, rules: tuple):
    """A sharding constraint by logical ``names`` under ``rules``, whatever rules are in context
    where it is applied (the stage dimension takes the stage axes the stages' rules lack)."""
    def constrain(h: jax.Array) -> jax.Array:
        with nn.logical_axis_rules(rules):
            return nn.with_logical_constraint(h, names)

    return constrain


def _split(x: jax.Array, count: int) -> jax.Array:
    """``[B, ...] -> [M, B / M, ...]``, microbatch ``m`` taking rows ``m, M + m, ...`` (as the
    core splits microbatches), so every microbatch has rows of every batch shard: the
    microbatch dimension is what the stages share, its rows what replica and data split."""
    return x.reshape(x.shape[0] // count, count, *x.shape[1:]).swapaxes(0, 1)


def _join(x: jax.Array) -> jax.Array:
    """The inverse of ``_split``."""
    return x.swapaxes(0, 1).reshape(x.shape[0] * x.shape[1], *x.shape[2:])
