"""Continuous batching on the host: requests wait for a slot, join the running batch when one
frees up, and leave it when they end, the other slots decoding on meanwhile.

The host checks each new token against the request's stop token ids, its stop strings (on the
text, decoded a token at a time: a string may span tokens), its ``max_tokens`` and the model's
maximum length; the finish reason says which ended it: ``stop`` (a stop token or string) or
``length`` (``max_tokens``, or the model's maximum length reached).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

import numpy as np

from pax_lm.decoding import SamplingSettings
from pax_lm.inference.detokenizing import IncrementalText
from pax_lm.inference.engine import Engine

FinishReason = Literal["stop", "length"]


@dataclasses.dataclass(frozen=True)
class Request:
    """A prompt's token ids and the settings to continue it with."""

    prompt: Sequence[int]
    settings: SamplingSettings = dataclasses.field(default_factory=SamplingSettings)


@dataclasses.dataclass(frozen=True)
class Completion:
    """What a request got: ``tokens``, the ids drawn (a stop token id not included; the ones
    that spelled a stop string are); ``text``, their text cut before the first stop string
    ("" without a detokenizer); ``finish_reason``: ``stop`` or ``length``."""

    request_id: int
    tokens: list[int]
    text: str
    finish_reason: FinishReason


@dataclasses.dataclass
class _Active:
    request_id: int
    request: Request
    text: IncrementalText | None  # with a detokenizer
    tokens: list[int] = dataclasses.field(default_factory=list)
    slot: int | None = None


class Batcher:
    """Runs requests through ``engine``'s slots; ``detokenize`` (token ids -> text) gives the
    completions' text, which stop strings need.

    ``submit`` queues a request; each ``step`` moves waiting requests into free slots
    (prefilling them together), advances every slot by one token and returns the requests that
    ended. ``run`` does that for a list of requests, yielding their completions in order.
    """

    def __init__(self, engine: Engine,
                 detokenize: Callable[[Sequence[int]], str] | None = None) -> None:
        self.engine, self.detokenize = engine, detokenize
        self._ids = itertools.count()
        self._waiting: deque[_Active] = deque()
        self._running: dict[int, _Active] = {}  # by slot
        # The call started and not yet read: its tokens (on the device) and the requests that
        # held its slots.
        self._ahead: tuple[Any, dict[int, int]] | None = None

    @property
    def busy(self) -> bool:
        """Whether a request is waiting or decoding, or a call's tokens are still to read."""
        return bool(self._waiting or self._running or self._ahead)

    def submit(self, request: Request) -> int:
        """Queue ``request`` (refused now if its prompt does not fit); its id."""
        self.engine.check_prompt(request.prompt)
        if request.settings.stop and self.detokenize is None:
            raise ValueError("stop strings are matched on the text: give the Batcher a "
                             "detokenize function")
        text = IncrementalText(self.detokenize) if self.detokenize is not None else None
        active = _Active(next(self._ids), request, text)
        self._waiting.append(active)
        return active.request_id

    def partial(self, request_id: int) -> str:
        """The text a request still waiting or decoding has so far (it only grows: a token
        that may still change its text waits for the next), for a caller that streams it."""
        for active in (*self._running.values(), *self._waiting):
            if active.request_id == request_id:
                return active.text.text if active.text is not None else ""
        raise KeyError(f"request {request_id} is not waiting or decoding")

    def cancel(self, request_id: int) -> bool:
        """Drop a request that is still waiting or decoding (its client went away), freeing
        its slot; whether it was."""
        for active in self._waiting:
            if active.request_id == request_id:
                self._waiting.remove(active)
                return True
        for slot, active in self._running.items():
            if active.request_id == request_id:
                del self._running[slot]
                self.engine.free(slot)
                return True
        return False

    def step(self) -> list[Completion]:
        """Admit waiting requests into free slots, start the engine's next call (its
        ``steps_per_call`` steps of every slot), and take the tokens of the call started
        before; the requests that ended, in the order they did.

        The device computes one call ahead of the host: the tokens a call drew are read while
        the next one runs, so checking them for stops never keeps the device waiting. A request
        that ends has had more tokens computed for it (the rest of its call, and the next
        call), which are dropped (a call's tokens are taken only for the requests that held
        their slots when it started)."""
        done = []
        joining = [self._waiting.popleft()
                   for _ in range(min(len(self._waiting), self.engine.free_slots))]
        if joining:  # prefilled together, and inserted together but those their first ended
            prefilled = self.engine.prefill([a.request.prompt for a in joining],
                                            [a.request.settings for a in joining])
            staying = []
            for row, (active, token) in enumerate(zip(joining, prefilled.tokens, strict=True)):
                finished = self._advance(active, token)
                if finished:
                    done.append(finished)
                else:
                    staying.append(row)
            for row, slot in zip(staying, self.engine.insert(prefilled, staying), strict=True):
                joining[row].slot = slot
                self._running[slot] = joining[row]
        started = None
        if self._running:
            started = (self.engine.dispatch(),
                       {slot: active.request_id for slot, active in self._running.items()})
        if self._ahead is not None:
            tokens, holders = self._ahead
            tokens = np.asarray(tokens)  # [steps, slots]
            for slot, request_id in holders.items():
                active = self._running.get(slot)
                if active is None or active.request_id != request_id:
                    continue  # it ended (or was cancelled) after the call started
                for token in tokens[:, slot].tolist():  # the rest, after an end, dropped
                    finished = self._advance(active, token)
                    if finished:
                        del self._running[slot]
                        self.engine.free(slot)
                        done.append(finished)
                        break
        self._ahead = started
        return done

    def run(self, requests: Iterable[Request]) -> Iterator[Completion]:
        """Every request's completion, in the requests' order, each yielded as soon as it and
        those before it have ended. Every request is checked before any is decoded. For a
        batcher that nothing else submits to (a server calls ``submit`` and ``step``)."""
        ids = [self.submit(r) for r in list(requests)]
        ended: dict[int, Completion] = {}
        for request_id in ids:
            while request_id not in ended:
                ended.update((c.request_id, c) for c in self.step())
            yield ended.pop(request_id)

    def _advance(self, active: _Active, token: int) -> Completion | None:
        """Take a request's new token; its completion if that ended it."""
        settings = active.request.settings
        if token in settings.stop_ids:
            return self._complete(active, "stop")
        active.tokens.append(token)
        piece = active.text.add(token) if active.text is not None else ""
        if settings.stop and piece:
            # Only a stop string that ends in the new piece is new: the earlier text was
            # searched as it came.
            text = active.text.text
            since = len(text) - len(piece)
            found = [i for i in (text.find(s, max(since - len(s) + 1, 0))
                                 for s in settings.stop) if i >= 0]
            if found:
                return Completion(active.request_id, active.tokens, text[:min(found)], "stop")
        if (len(active.tokens) >= settings.max_tokens
                or len(active.request.prompt) + len(active.tokens) >= self.engine.max_seq_len):
            return self._complete(active, "length")
        return None

    def _complete(self, active: _Active, reason: FinishReason) -> Completion:
        text = active.text.finish() if active.text is not None else ""
        return Completion(active.request_id, active.tokens, text, reason)


def generate(decoder: Any, variables: dict[str, Any], prompt: Sequence[int],
             settings: SamplingSettings, eos_id: int | None = None) -> list[int]:
    """Tokens that follow ``prompt`` (the prompt and ``eos_id`` not included): one request
    through an engine of one slot, for a caller with a single prompt. ``variables`` are the
    decoder's: ``params``, and any other collection it reads (an FP8 model's scales)."""
    if eos_id is not None:
        settings = dataclasses.replace(settings, stop_ids=(*settings.stop_ids, eos_id))
    [done] = Batcher(Engine(decoder, variables, slots=1)).run([Request(prompt, settings)])
    return done.tokens
