"""Pax's two pipeline schedules, GPipe and circular, written for SPMD.

One program runs every stage: the stage weights carry a leading ``stages`` dimension that the
partitioner shards over the ``stage`` mesh axis, the stage computation is ``jax.vmap``-ed over
it, and moving activations from stage ``s`` to ``s + 1`` is a roll of that dimension, which XLA
turns into a collective permute between neighbouring devices. A ``lax.scan`` runs the
iterations.

With S stages, M microbatches and R circular repeats (R = 1 is GPipe), the L layers form
``S x R`` groups of ``L / (S x R)`` consecutive layers; group ``r x S + s`` lives on stage ``s``,
so a microbatch passes through the stages R times. Work item ``k`` (microbatch ``k mod M`` on
its ``k // M``-th pass) enters stage 0 at iteration ``k`` and reaches stage ``s`` at iteration
``k + s``; the run takes ``M x R + S - 1`` iterations, of which each stage is idle (the bubble)
for ``S - 1``. The last stage's output of a pass waits in the input/output buffer until the
microbatch's next pass (at least one iteration later, since circular needs ``M >= S``).

Bubble iterations compute on zeros and their outputs are masked with ``jnp.where``, whose
gradient is exactly zero where it was not selected; the weights' gradient from a bubble
iteration is dropped the same way (Pax's bubble gradient skipping), so even a stage that turns
zeros into NaN cannot reach the outputs, the loss or the gradients.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

ITERATION_INPUT = "pipeline_iteration_input"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """How a batch flows through the stages: Pax's ``NUM_STAGES``, ``NUM_MICROBATCHES`` or
    ``MICROBATCH_SIZE`` (exactly one), ``CIRCULAR_REPEAT`` and ``STREAM_IO``.

    ``stream_io`` keeps the microbatches' inputs and outputs sharded over the stages (each
    stage holds ``M / S`` of them, rotated towards stage 0 one per iteration) instead of
    replicated on every stage: less memory per device, one small transfer per iteration.
    """

    num_stages: int
    num_microbatches: int | None = None
    microbatch_size: int | None = None
    circular_repeat: int = 1
    stream_io: bool = False

    def __post_init__(self) -> None:
        if self.num_stages < 1:
            raise ValueError(f"num_stages must be at least 1, got {self.num_stages}")
        if self.circular_repeat < 1:
            raise ValueError(f"circular_repeat must be at least 1, got {self.circular_repeat}")
        if (self.num_microbatches is None) == (self.microbatch_size is None):
            raise ValueError(
                "set exactly one of num_microbatches and microbatch_size (Pax's "
                "NUM_MICROBATCHES / MICROBATCH_SIZE); got "
                f"num_microbatches={self.num_microbatches}, "
                f"microbatch_size={self.microbatch_size}")
        for name in ("num_microbatches", "microbatch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")

    @property
    def kind(self) -> str:
        return "circular" if self.circular_repeat > 1 else "gpipe"

    @property
    def num_groups(self) -> int:
        """Groups of consecutive layers: one per stage and repeat."""
        return self.num_stages * self.circular_repeat

    def check(self, num_layers: int) -> None:
        """The layers must split evenly into ``stages x circular repeat`` groups (called by
        ``TransformerLm``'s validation, so a config that cannot build is exit 2)."""
        if num_layers % self.num_groups:
            raise ValueError(
                f"{num_layers} layers do not split over {self.num_stages} stages x "
                f"{self.circular_repeat} circular repeats; NUM_LAYERS must be a multiple of "
                f"{self.num_groups}")

    def microbatches(self, batch_size: int) -> int:
        """The number of microbatches of a batch of ``batch_size``, checked."""
        if self.microbatch_size is not None:
            if batch_size % self.microbatch_size:
                raise ValueError(f"a batch of {batch_size} does not split into microbatches of "
                                 f"{self.microbatch_size} (MICROBATCH_SIZE)")
            count = batch_size // self.microbatch_size
        else:
            count = self.num_microbatches
            if batch_size % count:
                raise ValueError(f"a batch of {batch_size} does not split into {count} "
                                 f"microbatches (NUM_MICROBATCHES)")
        if self.circular_repeat > 1 and count < self.num_stages:
            raise ValueError(f"the circular schedule needs at least as many microbatches as "
                             f"stages: {count} microbatches for {self.num_stages} stages")
        if self.stream_io and count % self.num_stages:
            raise ValueError(f"STREAM_IO needs the microbatches ({count}) to divide over the "
                             f"{self.num_stages} stages")
        return count

    def iterations(self, microbatches: int) -> int:
        return microbatches * self.circular_repeat + self.num_stages - 1

    def bubble(self, microbatches: int) -> float:
        """The fraction of stage-iterations spent idle: ``(S - 1) / (M x R + S - 1)``."""
        return (self.num_stages - 1) / self.iterations(microbatches)

    def describe(self, batch_size: int) -> dict[str, Any]:
        """What the run reports about its pipeline (``pax plan``, the start record)."""
        count = self.microbatches(batch_size)
        return {
            "pipeline_schedule": self.kind,
            "pipeline_stages": self.num_stages,
            "pipeline_circular_repeat": self.circular_repeat,
            "pipeline_microbatches": count,
            "pipeline_microbatch_size": batch_size // count,
            "pipeline_iterations": self.iterations(count),
            "pipeline_bubble": self.bubble(count),
            "pipeline_stream_io": self.stream_io,
        }


def experiment_settings(experiment: Any) -> dict[str, Any]:
    """A ``Schedule``'s fields from an experiment's Pax constants: ``NUM_STAGES``,
    ``NUM_MICROBATCHES``, ``MICROBATCH_SIZE``, ``CIRCULAR_REPEAT``, ``STREAM_IO``. The one
    reading of them, for the model's ``Pipeline`` and for the partitioner alike."""
    return {
        "num_stages": getattr(experiment, "NUM_STAGES", 1),
        "num_microbatches": getattr(experiment, "NUM_MICROBATCHES", None),
        "microbatch_size": getattr(experiment, "MICROBATCH_SIZE", None),
        "circular_repeat": getattr(experiment, "CIRCULAR_REPEAT", 1),
        "stream_io": bool(getattr(experiment, "STREAM_IO", False)),
    }


def to_stages(layers: Any, schedule: Schedule) -> Any:
    """Stored layer weights -> per-stage weights ``[S, R x layers_per_group, ...]``.

    GPipe stores ``[L, ...]`` (the layout of an unpipelined scanned stack: stage ``s`` holds
    rows ``s x L/S ...``, which is what sharding the first dimension over the stages gives);
    circular stores ``[R, L / R, ...]`` (the same layers in the same order, split by pass, so
    that sharding the second dimension gives stage ``s`` the groups ``s, S + s, 2S + s...``).
    """
    stages, repeats = schedule.num_stages, schedule.circular_repeat

    def split(w: jax.Array) -> jax.Array:
        if repeats == 1:
            return w.reshape(stages, w.shape[0] // stages, *w.shape[1:])
        per_group = w.shape[1] // stages
        w = w.reshape(repeats, stages, per_group, *w.shape[2:]).swapaxes(0, 1)
        return w.reshape(stages, repeats * per_group, *w.shape[3:])

    return jax.tree.map(split, layers)


def stored_shape(num_layers: int, schedule: Schedule) -> tuple[int, ...]:
    """The leading dimensions of the stored layer weights (see ``to_stages``)."""
    if schedule.circular_repeat == 1:
        return (num_layers,)
    return (schedule.circular_repeat, num_layers // schedule.circular_repeat)


StageFn = Callable[[Any, jax.Array, tuple[jax.Array, ...], jax.Array, jax.Array],
                   tuple[jax.Array, Any]]


def run(stage_fn: StageFn, stage_params: Any, microbatches: jax.Array,
        aux: tuple[jax.Array, ...], schedule: Schedule, *, rng: jax.Array,
        spmd_axis_name: Any = None,
        constrain_state: Callable[[jax.Array], jax.Array] = lambda x: x,
        constrain_io: Callable[[jax.Array], jax.Array] = lambda x: x) -> tuple[jax.Array, Any]:
    """Run the pipeline over ``microbatches`` ``[M, b, ...]``; returns the outputs
    ``[M, b, ...]`` and the stages' stats.

    ``stage_fn(params, x, aux, group, rng) -> (x, stats)`` computes one stage on one
    microbatch, with that stage's weights (``stage_params``: leading ``[S, ...]``), the
    microbatch's ``aux`` arrays (``[M, b, ...]`` each, e.g. positions and segment ids, which
    travel with it) and the pass ``group`` (0 .. R-1) it is on; ``stats`` is a tree of float
    arrays about that computation (a sparse layer's routing; ``{}`` for none), which come back
    with a leading ``[S]`` axis, each stage's the mean over the microbatches and passes it
    computed (bubble iterations left out). Every iteration is rematerialised in the backward
    pass from its saved stage inputs (Pax's default pipeline policy, ``SAVE_ITERATION_INPUT``);
    the stages keep their own remat policy inside.
    """
    stages, repeats = schedule.num_stages, schedule.circular_repeat
    count = microbatches.shape[0]
    items, total = count * repeats, schedule.iterations(count)
    stage_ids = jnp.arange(stages)

    def per_stage(mask: jax.Array, x: jax.Array) -> jax.Array:
        return mask.reshape(stages, *([1] * (x.ndim - 1)))

    def guarded_stage(params, x, aux, group, rng, valid):
        return stage_fn(_bubble_guard(params, valid), x, aux, group, rng)

    vmapped = jax.vmap(guarded_stage, spmd_axis_name=spmd_axis_name)

    def iteration(carry, t):
        state, state_aux, io = carry
        # Stage 0 takes item t's microbatch (fresh, or back from its last pass); stage s > 0
        # takes what stage s - 1 computed in the previous iteration.
        slot = t % count
        at_zero = stage_ids == 0

        def shift(state: jax.Array, first: jax.Array) -> jax.Array:
            return jnp.where(per_stage(at_zero, state), first[None], jnp.roll(state, 1, axis=0))

        x = shift(state, io[0] if schedule.stream_io else _index(io, slot))
        x_aux = tuple(shift(s, _index(a, slot)) for s, a in zip(state_aux, aux, strict=True))
        item = t - stage_ids
        valid = (item >= 0) & (item < items)
        group = jnp.clip(item // count, 0, repeats - 1)
        x = checkpoint_name(constrain_state(jnp.where(per_stage(valid, x), x, 0)),
                            ITERATION_INPUT)
        rngs = jax.random.split(jax.random.fold_in(rng, t), stages)
        out, stats = vmapped(stage_params, x, x_aux, group, rngs, valid)
        out = constrain_state(jnp.where(per_stage(valid, out), out, 0))
        io = constrain_io(_write_back(io, out[-1], t - (stages - 1), items, schedule))
        return (out, x_aux, io), jax.tree.map(lambda v: jnp.where(per_stage(valid, v), v, 0),
                                              stats)

    iteration = jax.checkpoint(iteration, prevent_cse=False,
                               policy=jax.checkpoint_policies.save_only_these_names(
                                   ITERATION_INPUT))
    state = constrain_state(jnp.zeros((stages, *microbatches.shape[1:]), microbatches.dtype))
    state_aux = tuple(jnp.zeros((stages, *a.shape[1:]), a.dtype) for a in aux)
    (_, _, io), stats = jax.lax.scan(
        iteration, (state, state_aux, constrain_io(microbatches)), jnp.arange(total))
    stats = jax.tree.map(lambda v: jnp.sum(v, axis=0) / items, stats)  # items per stage
    # Streamed buffers rotated once per iteration; put microbatch m back at index m.
    return (jnp.roll(io, total, axis=0) if schedule.stream_io else io), stats


def _index(x: jax.Array, i: jax.Array) -> jax.Array:
    return jax.lax.dynamic_index_in_dim(x, i, 0, keepdims=False)


def _write_back(io: jax.Array, finished: jax.Array, item: jax.Array, items: int,
                schedule: Schedule) -> jax.Array:
    """The last stage's output of work item ``item`` (if it is one) into its microbatch's slot.

    Streamed buffers turn by one slot per iteration, towards stage 0: slot ``j`` holds
    microbatch ``(t + j) mod M`` at iteration t, so item t - (S - 1) lands at ``1 - S``."""
    count = io.shape[0]
    keep = (item >= 0) & (item < items)
    if schedule.stream_io:
        where = (1 - schedule.num_stages) % count
        io = io.at[where].set(jnp.where(keep, finished, io[where]))
        return jnp.roll(io, -1, axis=0)
    where = jnp.maximum(item, 0) % count
    return jax.lax.dynamic_update_index_in_dim(
        io, jnp.where(keep, finished, _index(io, where)), where, 0)


@jax.custom_vjp
def _bubble_guard(params: Any, valid: jax.Array) -> Any:
    """The weights, unchanged; in the backward pass their gradient is dropped (selected away,
    never multiplied) when this stage-iteration is a bubble."""
    return params


def _guard_fwd(params: Any, valid: jax.Array) -> tuple[Any, jax.Array]:
    return params, valid


def _guard_bwd(valid: jax.Array, grads: Any) -> tuple[Any, None]:
    return jax.tree.map(lambda g: jnp.where(valid, g, jnp.zeros_like(g)), grads), None


_bubble_guard.defvjp(_guard_fwd, _guard_bwd)

