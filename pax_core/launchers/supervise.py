"""The processes of one run, supervised together: their output forwarded with a prefix, and
the first failure, or a stop asked of the launcher, stopping all of them.

Every launcher of ``pax launch`` ends here: the local one runs the run's processes themselves,
the Cloud TPU one runs a ``gcloud ... ssh`` per worker. A run cannot go on without one of its
processes, so the first failure stops the others: they get SIGTERM, and SIGKILL ``GRACE_S``
seconds later; the exit code is the first failure's (128 + N for a process killed by signal
N). Ctrl-C or SIGTERM to the launcher is passed on the same way (a second one kills at once).
A process that stopped on request (exit 143 or 130: it saved its checkpoint) is not a failure:
the others stop at the same step (JAX's preemption sync point), and the launcher exits with
that status. Each process runs in its own session, so that a terminal's Ctrl-C reaches only
the launcher and a stop reaches every process a command started (a ``sh -c`` wrapper's
children too).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

from pax_core.errors import UsageError

GRACE_S = 5
STOPPED = (128 + signal.SIGTERM, 128 + signal.SIGINT)
# The lines of a process whose output is not shown that its failure prints, to say why.
KEPT_LINES = 20
# gloo prints "[Gloo] Rank i is connected to n peer ranks. Expected ..." for every communicator
# it builds, from several threads at once, so pieces of two messages can share a line.
_NOISE = re.compile(r"\[Gloo\]|connected to \d+ peer ranks|connected peer ranks is")
# Gloo's threads write that message in pieces, so what is left of a line after it can be a lone
# number or nothing.
_FRAGMENT = re.compile(r"\s*\d*\s*")


class NoiseFilter:
    """Drops gloo's connection messages, and the fragments they leave, from a process's lines
    (the JAX CPU collectives of a multi-process run print one per communicator)."""

    def __init__(self) -> None:
        self.after_noise = False

    def keep(self, line: str) -> bool:
        if _NOISE.search(line) or (self.after_noise and _FRAGMENT.fullmatch(line)):
            self.after_noise = True
            return False
        self.after_noise = False
        return True


@dataclasses.dataclass
class Child:
    """One process of the run: its output's prefix, its name in messages, command and
    environment; a child not ``shown`` keeps its last lines, printed if it fails."""

    label: str
    name: str
    argv: list[str]
    env: dict[str, str]
    shown: bool = True
    kept: collections.deque[str] = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=KEPT_LINES))


def supervise(children: list[Child], on_stop: Callable[[], None] | None = None) -> int:
    """Start ``children`` and wait for all of them; returns the exit code for the launcher.

    ``on_stop`` runs once when they are being stopped (a failure or the launcher's signal),
    for what a signal to a local process does not reach (a remote worker)."""
    # One queue carries the processes' exits and the launcher's own signals, so the main
    # thread reacts to whichever comes first without polling.
    events: queue.SimpleQueue[tuple[int | None, int]] = queue.SimpleQueue()
    previous = {s: signal.signal(s, lambda signum, _: events.put((None, signum)))
                for s in (signal.SIGINT, signal.SIGTERM)}
    started: list[subprocess.Popen] = []
    try:
        for child in children:
            try:
                started.append(subprocess.Popen(
                    child.argv, env=child.env, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True))
            except OSError as e:
                _signal(started, set(range(len(started))), signal.SIGKILL)
                raise UsageError(f"pax launch: cannot run '{child.argv[0]}': "
                                 f"{e.strerror}") from e
        return _wait(children, started, events, on_stop)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _wait(children: list[Child], started: list[subprocess.Popen],
          events: queue.SimpleQueue[tuple[int | None, int]],
          on_stop: Callable[[], None] | None) -> int:
    """Forward output and wait for every process; stop them all at the first failure or signal.

    ``events`` receives ``(index, exit status)`` for each process and ``(None, signal)`` for
    the launcher's own signals.
    """
    lock = threading.Lock()
    forwarders = {index: [threading.Thread(target=_forward, args=(stream, out, child, lock),
                                           daemon=True)
                          for stream, out in ((process.stdout, sys.stdout),
                                              (process.stderr, sys.stderr))]
                  for index, (child, process) in enumerate(zip(children, started, strict=True))}
    for index, process in enumerate(started):
        for thread in forwarders[index]:
            thread.start()
        threading.Thread(target=lambda i=index, p=process: events.put((i, p.wait())),
                         daemon=True).start()
    running, code, deadline = set(range(len(started))), 0, None
    stopping = False

    def stop(signum: int) -> None:
        nonlocal stopping
        _signal(started, running, signum)
        if not stopping and on_stop is not None:
            on_stop()
        stopping = True

    while running:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            index, value = events.get(timeout=timeout)
        except queue.Empty:
            _signal(started, running, signal.SIGKILL)
            deadline = None
            continue
        if index is None:  # the launcher was asked to stop: a second request kills
            again = deadline is not None
            code = code or 128 + value
            stop(signal.SIGKILL if again else value)
            deadline = None if again else time.monotonic() + GRACE_S
            continue
        running.discard(index)
        for thread in forwarders[index]:  # its last lines come before what follows
            thread.join(GRACE_S)  # (a descendant outside its process group may hold a pipe)
        status = 128 - value if value < 0 else value
        if status in STOPPED:  # stopped on request: the others stop at the same step
            code = code or status
            continue
        if status and not code:
            code = status
            child = children[index]
            how = f"was killed by signal {-value}" if value < 0 else f"exited with {value}"
            with lock:
                for line in child.kept:  # why it failed, where its output was not shown
                    print(f"[{child.label}] {line}", file=sys.stderr)
                print(f"pax launch: {child.name} {how}"
                      f"{'; stopping the others' if running else ''}", file=sys.stderr,
                      flush=True)
            if running:
                stop(signal.SIGTERM)
                deadline = time.monotonic() + GRACE_S
    return code


def _forward(stream: IO[bytes], out: IO[str], child: Child, lock: threading.Lock) -> None:
    noise = NoiseFilter()
    for raw in stream:
        line = raw.decode(errors="replace").rstrip("\n")
        if not noise.keep(line):
            continue
        if not child.shown:
            child.kept.append(line)
            continue
        with lock:
            print(f"[{child.label}] {line}", file=out, flush=True)


def _signal(started: list[subprocess.Popen], indices: set[int], signum: int) -> None:
    """Send ``signum`` to the process group of each child in ``indices``."""
    for index in indices:
        with contextlib.suppress(ProcessLookupError):  # it has just exited
            os.killpg(started[index].pid, signum)
