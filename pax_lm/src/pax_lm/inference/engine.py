"""The decoding engine: a pool of KV-cache rows (slots) that requests join and leave.

The prompts of the requests joining together are prefilled together: one call over their rows,
right-padded to the bucket length of the longest (each row's cache index set back to its own
length) and their row count padded to a power of two, so that each bucket and row count
compiles once; it also draws each prompt's first token. ``insert`` copies those rows into free
slots in one call; ``generate`` then advances every slot by ``steps_per_call`` tokens in one
call of one compiled program (a scan of decode steps), each row at its own position
(pax-transformer's per-row cache index) with its own sampling settings and key; ``free`` gives
a finished request's slot back. A free slot still computes in ``generate`` (the pool's shape
never changes), on whatever it last held, its index kept inside the cache; its tokens are not
read.

Several steps a call because a decode step of a small model takes a fraction of a millisecond,
which the host's dispatch of a call (its arguments, the weights among them, flattened and
checked) would otherwise add to every token; the host reads a call's tokens, and checks them
for stops, once a call. A request that ends within a call has the rest of its steps computed
and dropped; a token's draw depends on its row's seed and position only, so the tokens are
those of one step a call.

The engine's state lives on the device as one pytree (the cache, each slot's last token and
sampling settings). Every program is built the first time it is called and reused for every
request after: ``compilations`` counts them.
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
STEPS_PER_CALL = 8  # decode steps a call of ``generate``


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
    """Prompts run through the decoder together: ``rows``, the state ``insert`` copies into
    slots (their caches, first tokens and settings, on the device; padded rows after the
    prompts'), and ``tokens``, the first token each prompt drew."""

    rows: Any
    tokens: list[int]


class Engine:
    """``slots`` decoding rows over ``decoder`` (a ``TransformerLm``: its cache holds a per-row
    ``index``) with ``variables`` (its ``params`` and any other collection it reads).

    Prompts must leave room for a new token: at most ``max_seq_len - 1`` tokens.
    """

    def __init__(self, decoder: Any, variables: dict[str, Any], slots: int,
                 smallest_bucket: int = SMALLEST_BUCKET,
                 steps_per_call: int = STEPS_PER_CALL) -> None:
        if slots < 1:
            raise UsageError(f"the engine needs at least one slot, got {slots}")
        if steps_per_call < 1:
            raise UsageError(f"the engine takes at least one step a call, got {steps_per_call}")
        self.decoder, self.slots, self.steps_per_call = decoder, slots, steps_per_call
        self.max_seq_len: int = decoder.max_seq_len
        self.buckets = prefill_buckets(self.max_seq_len, smallest_bucket)
        # How many rows a prefill computes: the prompts' count padded to one of these.
        self.row_counts = prefill_buckets(slots, 1)
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
        self._prefill = jax.jit(self._prefill_rows, out_shardings=placement)
        self._insert = jax.jit(partial(_insert, state_axes), out_shardings=placement,
                               donate_argnums=0)
        self._generate = jax.jit(self._steps, out_shardings=placement, donate_argnums=1)

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

    def prefill(self, prompts: Sequence[Sequence[int]],
                settings: Sequence[SamplingSettings]) -> Prefilled:
        """Run ``prompts`` (at most ``slots`` of them), each with its ``settings``, through
        the decoder together and draw each one's first token."""
        if not 0 < len(prompts) <= self.slots or len(settings) != len(prompts):
            raise ValueError(f"prefill takes 1 to {self.slots} prompts, each with its "
                             f"settings; got {len(prompts)} prompts, {len(settings)} settings")
        for prompt in prompts:
            self.check_prompt(prompt)
        rows = next(r for r in self.row_counts if r >= len(prompts))
        ids = np.zeros((rows, self.bucket(max(map(len, prompts)))), np.int32)
        lengths = np.ones(rows, np.int32)  # a padded row: one token, its draw not read
        for row, prompt in enumerate(prompts):
            ids[row, :len(prompt)], lengths[row] = prompt, len(prompt)
        padded = [*settings, *[SamplingSettings()] * (rows - len(prompts))]
        state = self._prefill(self.variables, ids, lengths, _settings_arrays(padded))
        return Prefilled(state, np.asarray(state["tokens"])[:len(prompts)].tolist())

    @property
    def free_slots(self) -> int:
        """How many slots hold no request."""
        return len(self._free)

    def insert(self, prefilled: Prefilled, rows: Sequence[int] | None = None) -> list[int]:
        """Copy the prefilled ``rows`` (every prompt's by default) into free slots, which
        ``generate`` then advances; their slot numbers, in the rows' order."""
        rows = range(len(prefilled.tokens)) if rows is None else rows
        if len(rows) > len(self._free):
            raise RuntimeError(f"{len(rows)} rows to insert and {len(self._free)} of "
                               f"{self.slots} slots free: free some first")
        taken, self._free = self._free[:len(rows)], self._free[len(rows):]
        # Where each computed row goes: a slot, or past the last (dropped) for the others.
        targets = np.full(len(prefilled.rows["tokens"]), self.slots, np.int32)
        targets[list(rows)] = taken
        self._state = self._insert(self._state, prefilled.rows, targets)
        return taken

    def free(self, slot: int) -> None:
        """Give ``slot`` back: its request has ended."""
        if slot in self._free or not 0 <= slot < self.slots:
            raise RuntimeError(f"slot {slot} holds no request")
        self._free.append(slot)
        self._free.sort()

    def generate(self) -> np.ndarray:
        """``steps_per_call`` steps of every slot: the tokens each drew, in order
        ([steps_per_call, slots]; a free slot's mean nothing)."""
        return np.asarray(self.dispatch())

    def dispatch(self) -> jax.Array:
        """Start ``steps_per_call`` steps of every slot and return at once: the tokens they
        draw, still on the device (reading them waits for the steps). Calls run in the order
        started."""
        self._state, tokens = self._generate(self.variables, self._state)
        return tokens

    def compilations(self) -> dict[str, int]:
        """How many programs each of the engine's calls has compiled: ``prefill`` one a
        bucket and row count used, ``insert`` one a row count, ``generate`` one."""
        return {name: fn._cache_size() for name, fn in (
            ("prefill", self._prefill), ("insert", self._insert), ("generate", self._generate))}

    def _prefill_rows(self, variables: dict[str, Any], ids: jax.Array, lengths: jax.Array,
                      settings: dict[str, jax.Array]) -> dict[str, Any]:
        """The state of right-padded prompts: their cache with each row's index set back to
        its prompt's length (the padding's keys lie past it, masked until overwritten), and
        the first tokens drawn from each prompt's last position's logits."""
        empty = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                             cache_shapes(self.decoder, ids.shape[0]))
        logits, mutated = self.decoder.apply({**variables, "cache": empty}, ids, decode=True,
                                             mutable=["cache"])
        cache = {**mutated["cache"], "index": lengths}
        last = logits[jnp.arange(ids.shape[0]), lengths - 1]
        tokens = sample(last, settings["seed"], lengths, settings["temperature"],
                        settings["top_k"], settings["top_p"])
        return {"cache": cache, "tokens": tokens, **settings}

    def _steps(self, variables: dict[str, Any], state: dict[str, Any]
               ) -> tuple[dict[str, Any], jax.Array]:
        """``steps_per_call`` steps: the state after them, and their tokens [steps, slots]."""
        return jax.lax.scan(lambda carried, _: self._step(variables, carried), state, None,
                            length=self.steps_per_call)

    def _step(self, variables: dict[str, Any], state: dict[str, Any]
              ) -> tuple[dict[str, Any], jax.Array]:
        """Feed every slot's last token at its own index; draw the next one at index + 1."""
        logits, mutated = self.decoder.apply({**variables, "cache": state["cache"]},
                                             state["tokens"][:, None], decode=True,
                                             mutable=["cache"])
        index = mutated["cache"]["index"]  # the position of the token drawn now
        tokens = sample(logits[:, 0], state["seed"], index, state["temperature"],
                        state["top_k"], state["top_p"])
        # A free slot keeps stepping: hold its index inside the cache. So does a request's
        # steps past its end (the rest of its last call, and the next call, which runs while
        # the Batcher reads the tokens), which may go past its last position; what they write
        # there is never read.
        cache = {**mutated["cache"], "index": jnp.minimum(index, self.max_seq_len - 1)}
        return {**state, "cache": cache, "tokens": tokens}, tokens


_SETTINGS = ("temperature", "top_k", "top_p", "seed")


def _settings_arrays(settings: Sequence[SamplingSettings]) -> dict[str, np.ndarray]:
    """The device-side sampling settings of rows, one array each."""
    return {"temperature": np.asarray([s.temperature for s in settings], np.float32),
            "top_k": np.asarray([s.top_k for s in settings], np.int32),
            "top_p": np.asarray([s.top_p for s in settings], np.float32),
            "seed": np.asarray([s.seed for s in settings], np.uint32)}


def _insert(axes: Any, state: Any, rows: Any, targets: jax.Array) -> Any:
    """``state`` with each of ``rows`` (rows of every entry) written at its slot in
    ``targets``; a target past the last slot drops its row."""
    return jax.tree.map(
        lambda pool, new, axis: pool.at[(slice(None),) * axis + (targets,)].set(
            new.astype(pool.dtype), mode="drop"), state, rows, axes)
