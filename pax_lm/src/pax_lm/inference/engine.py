"""The decoding engine: a pool of KV-cache rows (slots) that requests join and leave.

A request's prompt is prefilled on its own (one row, right-padded to a bucket length so that
each bucket compiles once), which also draws its first token; ``insert`` copies that row into a
free slot; ``generate`` then advances every slot by one token in one call of one compiled
program, each row at its own position (pax-transformer's per-row cache index) with its own
sampling settings and key; ``free`` gives a finished request's slot back. A free slot still
computes in ``generate`` (the pool's shape never changes), on whatever it last held, its index
kept inside the cache; its token is not read.

The engine's state lives on the device as one pytree (the cache, each slot's last token and
sampling settings); the host sees one token per slot per step. Every program is built the first
time it is called and reused for every request after: ``compilations`` counts them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from pax_core import UsageError
from pax_lm.decoding import SamplingSettings, sample
from pax_lm.inference.cache import cache_shapes, row_axes, state_placement

SMALLEST_BUCKET = 16


def prefill_buckets(max_seq_len: int, smallest: int = SMALLEST_BUCKET) -> tuple[int, ...]:
    """The lengths prompts are padded to: powers of two from ``smallest`` below
    ``max_seq_len``, then ``max_seq_len`` itself."""
    buckets, length = [], smallest
    while length < max_seq_len:
        buckets.append(length)
        length *= 2
    return (*buckets, max_seq_len)


@dataclasses.dataclass(frozen=True)
class Prefilled:
    """A prompt run through the decoder on its own: ``row``, the one-row state ``insert``
    copies into a slot (its cache, first token and settings, on the device), and ``token``,
    the first token it drew."""

    row: Any
    token: int


class Engine:
    """``slots`` decoding rows over ``decoder`` (a ``TransformerLm``: its cache holds a per-row
    ``index``) with ``variables`` (its ``params`` and any other collection it reads).

    Prompts must leave room for a new token: at most ``max_seq_len - 1`` tokens.
    """

    def __init__(self, decoder: Any, variables: dict[str, Any], slots: int,
                 smallest_bucket: int = SMALLEST_BUCKET) -> None:
        if slots < 1:
            raise UsageError(f"the engine needs at least one slot, got {slots}")
        self.decoder, self.slots = decoder, slots
        self.max_seq_len: int = decoder.max_seq_len
        self.buckets = prefill_buckets(self.max_seq_len, smallest_bucket)
        self._row_cache = cache_shapes(decoder, 1)
        axes = row_axes(decoder)
        state_axes = {"cache": axes, **dict.fromkeys((*_SETTINGS, "tokens"), 0)}
        pool = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), cache_shapes(decoder, slots))
        # The state stays where every call puts it (whole on each device of the weights), so
        # each call's inputs always look the same to jit: one program per call.
        placement = state_placement(variables)
        # Weights still on the host go to the device once, not with every call.
        self.variables = jax.tree.map(
            lambda x: x if isinstance(x, jax.Array) else jax.device_put(x, placement), variables)
        self._state = jax.device_put({"cache": pool, "tokens": np.zeros(slots, np.int32),
                                      **_settings_arrays([SamplingSettings()] * slots)},
                                     placement)
        self._free = list(range(slots))
        self._prefill = jax.jit(self._prefill_row, out_shardings=placement)
        self._insert = jax.jit(partial(_insert, state_axes), out_shardings=placement,
                               donate_argnums=0)
        self._generate = jax.jit(self._step, out_shardings=placement, donate_argnums=1)

    def check_prompt(self, prompt: Sequence[int]) -> None:
        """A ``UsageError`` for a prompt this engine cannot continue: empty, or leaving no
        room for a new token."""
        if not prompt:
            raise UsageError("the prompt is empty")
        if len(prompt) >= self.max_seq_len:
            raise UsageError(
                f"the prompt is {len(prompt)} tokens long; this model's maximum length is "
                f"{self.max_seq_len}, so the prompt must be at most {self.max_seq_len - 1} "
                f"tokens")

    def bucket(self, length: int) -> int:
        """The padded length of a prompt of ``length`` tokens."""
        return next(b for b in self.buckets if b >= length)

    def prefill(self, prompt: Sequence[int], settings: SamplingSettings) -> Prefilled:
        """Run ``prompt`` through the decoder on its own and draw its first token."""
        self.check_prompt(prompt)
        ids = np.zeros((1, self.bucket(len(prompt))), np.int32)
        ids[0, :len(prompt)] = prompt
        row = self._prefill(self.variables, ids, np.int32(len(prompt)),
                            _settings_arrays([settings]))
        return Prefilled(row, int(np.asarray(row["tokens"])[0]))

    @property
    def free_slots(self) -> int:
        """How many slots hold no request."""
        return len(self._free)

    def insert(self, prefilled: Prefilled) -> int:
        """Copy a prefilled row into a free slot, which ``generate`` then advances; its
        number."""
        if not self._free:
            raise RuntimeError(f"all {self.slots} slots are taken: free one first")
        slot = self._free.pop(0)
        self._state = self._insert(self._state, prefilled.row, np.int32(slot))
        return slot

    def free(self, slot: int) -> None:
        """Give ``slot`` back: its request has ended."""
        if slot in self._free or not 0 <= slot < self.slots:
            raise RuntimeError(f"slot {slot} holds no request")
        self._free.append(slot)
        self._free.sort()

    def generate(self) -> np.ndarray:
        """One step of every slot: the token each drew ([slots]; a free slot's means
        nothing)."""
        return np.asarray(self.dispatch())

    def dispatch(self) -> jax.Array:
        """Start one step of every slot and return at once: the tokens it draws, still on the
        device (reading them waits for the step). Steps run in the order started."""
        self._state, tokens = self._generate(self.variables, self._state)
        return tokens

    def compilations(self) -> dict[str, int]:
        """How many programs each of the engine's calls has compiled: ``prefill`` one a
        bucket used, ``insert`` and ``generate`` one each."""
        return {name: fn._cache_size() for name, fn in (
            ("prefill", self._prefill), ("insert", self._insert), ("generate", self._generate))}

    def _prefill_row(self, variables: dict[str, Any], ids: jax.Array, length: jax.Array,
                     settings: dict[str, jax.Array]) -> dict[str, Any]:
        """The one-row state of a right-padded prompt: its cache with the index set back to
        the prompt's length (the padding's keys lie past it, masked until overwritten), and
        the first token drawn from the last prompt position's logits."""
        empty = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), self._row_cache)
        logits, mutated = self.decoder.apply({**variables, "cache": empty}, ids, decode=True,
                                             mutable=["cache"])
        cache = {**mutated["cache"], "index": jnp.reshape(length, (1,))}
        last = jax.lax.dynamic_slice_in_dim(logits[0], length - 1, 1)
        token = sample(last, settings["seed"], cache["index"], settings["temperature"],
                       settings["top_k"], settings["top_p"])
        return {"cache": cache, "tokens": token, **settings}

    def _step(self, variables: dict[str, Any], state: dict[str, Any]
              ) -> tuple[dict[str, Any], jax.Array]:
        """Feed every slot's last token at its own index; draw the next one at index + 1."""
        logits, mutated = self.decoder.apply({**variables, "cache": state["cache"]},
                                             state["tokens"][:, None], decode=True,
                                             mutable=["cache"])
        index = mutated["cache"]["index"]  # the position of the token drawn now
        tokens = sample(logits[:, 0], state["seed"], index, state["temperature"],
                        state["top_k"], state["top_p"])
        # A free slot keeps stepping: hold its index inside the cache. So does a request's one
        # step past its end (the Batcher reads a step's tokens while the next one runs), which
        # may be one past its last position; what it writes there is never read.
        cache = {**mutated["cache"], "index": jnp.minimum(index, self.max_seq_len - 1)}
        return {**state, "cache": cache, "tokens": tokens}, tokens


_SETTINGS = ("temperature", "top_k", "top_p", "seed")


def _settings_arrays(settings: Sequence[SamplingSettings]) -> dict[str, np.ndarray]:
    """The device-side sampling settings of rows, one array each."""
    return {"temperature": np.asarray([s.temperature for s in settings], np.float32),
            "top_k": np.asarray([s.top_k for s in settings], np.int32),
            "top_p": np.asarray([s.top_p for s in settings], np.float32),
            "seed": np.asarray([s.seed for s in settings], np.uint32)}


def _insert(axes: Any, state: Any, row: Any, slot: jax.Array) -> Any:
    """``state`` with ``row`` (one row of every entry) written at ``slot``."""
    return jax.tree.map(
        lambda pool, new, axis: jax.lax.dynamic_update_slice_in_dim(
            pool, new.astype(pool.dtype), slot, axis), state, row, axes)
