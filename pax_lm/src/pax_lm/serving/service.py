"""The decoding service: one thread that owns the engine, fed by many request handlers.

A server's handlers run on an event loop; JAX's calls block. So one thread drives the
``Batcher`` (which is not thread-safe) and everything else talks to it through ``submit``, which
returns a ``Stream`` of the request's events on the caller's loop: ``Delta`` as text becomes
final, then one ``Done``. The thread admits submitted requests, drops cancelled ones, and steps
the batch while anything is waiting or decoding; it sleeps otherwise.

Admission is bounded: at most ``slots + max_waiting`` requests are in the service at once, and
one more is refused with ``Busy`` (a server's 429) rather than queued without end. ``drain``
refuses every new request with ``ShuttingDown`` (503) while those already in finish; ``close``
waits for that and ends the thread.

Streamed text holds back what may still change: the tail that could begin a stop string (the
final text is cut before one); the Batcher's text already waits out a token whose text the next
may change (a byte tokenizer's unfinished UTF-8 character). So a client never receives text
that is later taken back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
from collections.abc import Sequence

from pax_lm.decoding import SamplingSettings
from pax_lm.inference import Batcher, Completion, Request


class Busy(Exception):
    """Every slot is taken and the queue is full: try again later."""


class ShuttingDown(Exception):
    """The service is draining: it takes no new request."""


@dataclasses.dataclass(frozen=True)
class Delta:
    """Text of a streamed request that is now final."""

    text: str


@dataclasses.dataclass(frozen=True)
class Done:
    """The request ended: its completion, or the error that ended it."""

    completion: Completion | None
    error: BaseException | None = None


class Stream:
    """A submitted request's events, read on the event loop that submitted it."""

    def __init__(self, service: DecodeService, request: Request, stream: bool,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.request, self.stream = request, stream
        self._service, self._loop = service, loop
        self._events: asyncio.Queue[Delta | Done] = asyncio.Queue()
        self.sent = ""  # the text streamed so far
        self.request_id: int | None = None  # the batcher's, once admitted

    async def next(self) -> Delta | Done:
        """The next event: a ``Delta`` (streaming requests only), or the last, ``Done``."""
        return await self._events.get()

    async def completion(self) -> Completion:
        """Wait for the end; the completion (an error that ended the request is raised)."""
        while True:
            event = await self.next()
            if isinstance(event, Done):
                if event.error is not None:
                    raise event.error
                return event.completion

    def cancel(self) -> None:
        """The client went away: stop decoding for it."""
        self._service._cancel(self)

    def _put(self, event: Delta | Done) -> None:
        """Hand an event to the loop (called from the service's thread)."""
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is listening
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)


class DecodeService:
    """Serves ``batcher`` from a thread of its own; at most ``max_waiting`` requests wait for
    a slot beyond those decoding."""

    def __init__(self, batcher: Batcher, max_waiting: int) -> None:
        self.batcher, self.max_waiting = batcher, max_waiting
        self.capacity = batcher.engine.slots + max_waiting
        self._condition = threading.Condition()
        self._inbox: list[Stream] = []
        self._cancelled: list[Stream] = []
        self._streams: dict[int, Stream] = {}  # admitted, by request id
        self._count = 0  # requests in the service, from submit to their Done
        self._draining = self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="pax-decode", daemon=True)
        self._thread.start()

    @property
    def draining(self) -> bool:
        """Whether new requests are refused."""
        return self._draining

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet ended."""
        return self._count

    def submit(self, request: Request, stream: bool = False) -> Stream:
        """Queue ``request`` (checked by the caller: ``Batcher.submit`` refuses in the
        service's thread only what cannot happen); its events arrive on the running loop."""
        handle = Stream(self, request, stream, asyncio.get_running_loop())
        with self._condition:
            if self._draining:
                raise ShuttingDown("the server is shutting down and takes no new requests")
            if self._count >= self.capacity:
                raise Busy(f"the server is busy: {self.batcher.engine.slots} requests are "
                           f"decoding and {self.max_waiting} waiting; retry later")
            self._count += 1
            self._inbox.append(handle)
            self._condition.notify()
        return handle

    def drain(self) -> None:
        """Refuse new requests from now on; those in the service finish."""
        with self._condition:
            self._draining = True

    def close(self, timeout: float | None = None) -> None:
        """Drain, wait for the requests in the service to end, and stop the thread."""
        with self._condition:
            self._draining = self._stopping = True
            self._condition.notify()
        self._thread.join(timeout)

    def _cancel(self, handle: Stream) -> None:
        with self._condition:
            self._cancelled.append(handle)
            self._condition.notify()

    def _serve(self) -> None:
        while True:
            with self._condition:
                while not (self._inbox or self._cancelled or self.batcher.busy
                           or self._stopping):
                    self._condition.wait()
                if self._stopping and not (self._inbox or self.batcher.busy):
                    return
                admitted, self._inbox = self._inbox, []
                cancelled, self._cancelled = self._cancelled, []
            for handle in admitted:
                self._admit(handle)
            for handle in cancelled:
                if handle.request_id is not None and handle.request_id in self._streams:
                    self.batcher.cancel(handle.request_id)
                    self._end(handle.request_id, Done(None, ConnectionAbortedError()))
            if self.batcher.busy:
                self._step()

    def _admit(self, handle: Stream) -> None:
        try:
            handle.request_id = self.batcher.submit(handle.request)
        except Exception as e:  # the request's own error, handed to it
            self._finish(handle, Done(None, e))
            return
        self._streams[handle.request_id] = handle

    def _step(self) -> None:
        try:
            ended = self.batcher.step()
        except Exception as e:  # a failed step fails its requests, not the server
            for request_id in list(self._streams):
                self.batcher.cancel(request_id)
                self._end(request_id, Done(None, e))
            return
        for completion in ended:
            handle = self._streams[completion.request_id]
            if handle.stream:
                _send(handle, completion.text)
            self._end(completion.request_id, Done(completion))
        for request_id, handle in self._streams.items():
            if handle.stream:
                _send(handle, settled(self.batcher.partial(request_id),
                                      handle.request.settings.stop))

    def _end(self, request_id: int, done: Done) -> None:
        self._finish(self._streams.pop(request_id), done)

    def _finish(self, handle: Stream, done: Done) -> None:
        with self._condition:
            self._count -= 1
        handle._put(done)


def _send(handle: Stream, text: str) -> None:
    """Stream the part of ``text`` (what was sent, and more or nothing more) past what was
    sent."""
    if len(text) > len(handle.sent):
        handle._put(Delta(text[len(handle.sent):]))
        handle.sent = text


def settled(text: str, stop: Sequence[str]) -> str:
    """The part of a growing ``text`` that no later token can change: without a tail that may
    be the start of a stop string."""
    held = max((k for s in stop for k in range(1, len(s)) if text.endswith(s[:k])), default=0)
    return text[:len(text) - held]


def warm_up(batcher: Batcher, prompt_token: int) -> dict[str, int]:
    """Compile every program a request can need before the first one arrives: a prefill per
    bucket and row count, an insert per row count and the generate step. Runs before the
    service starts; the engine's compilation counts after."""
    engine = batcher.engine
    for rows in engine.row_counts:
        for bucket in engine.buckets:
            length = min(bucket, engine.max_seq_len - 1)
            engine.prefill([[prompt_token] * length] * rows, [SamplingSettings()] * rows)
        requests = [Request([prompt_token], SamplingSettings(max_tokens=2))] * rows
        list(batcher.run(requests))  # its rows join together: their insert compiles
    return engine.compilations()

