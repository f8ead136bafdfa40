"""``pax launch``: one command as the N processes of a multi-process run on this machine.

For development and tests: the processes are told what a cluster would tell them (the
coordinator address, here 127.0.0.1 with a free port, the process count and their index,
through ``PAX_COORDINATOR_ADDRESS``, ``PAX_NUM_PROCESSES`` and ``PAX_PROCESS_ID``), so
``pax launch --processes 2 -- pax train ...`` runs exactly what two hosts would. JAX's
coordination service, which process 0 serves, listens on every network interface unless told
otherwise; the processes here reach it on this machine, so it is told to listen on 127.0.0.1
only (``JAX_COORDINATOR_BIND_ADDRESS``), out of other hosts' reach, unless ``--bind`` names
another address of this machine.

A multi-process run cannot go on without one of its processes, so the first failure stops the
others: they get SIGTERM, and SIGKILL ``GRACE_S`` seconds later; the exit code is the first
failure's (128 + N for a process killed by signal N). Ctrl-C or SIGTERM to the launcher is
passed on the same way (a second one kills at once). A process that stopped on request (exit
143 or 130: it saved its checkpoint) is not a failure: the others stop at the same step (JAX's
preemption sync point), and the launcher exits with that status. Each process runs in its own
session, so that a terminal's Ctrl-C reaches only the launcher and a stop reaches every process
a command started (a ``sh -c`` wrapper's children too).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from pax_core.errors import UsageError
from pax_core.parallel.processes import DistributedOptions

GRACE_S = 5
# Where JAX's coordination service listens (jax.distributed.initialize reads it): set for
# every process, so that one in the launcher's environment cannot name another port.
BIND_VARIABLE = "JAX_COORDINATOR_BIND_ADDRESS"
# gloo prints "[Gloo] Rank i is connected to n peer ranks. Expected ..." for every communicator
# it builds, from several threads at once, so pieces of two messages can share a line.
_NOISE = re.compile(r"\[Gloo\]|connected to \d+ peer ranks|connected peer ranks is")
# Gloo's threads write that message in pieces, so what is left of a line after it can be a lone
# number or nothing.
_FRAGMENT = re.compile(r"\s*\d*\s*")


def launch(command: list[str], processes: int, cpu_devices: int | None = None,
           bind: str = "127.0.0.1") -> int:
    """Run ``command`` as ``processes`` local processes; returns the exit code for the launcher.

    With ``cpu_devices``, each process runs on the CPU with that many devices. A first word
    ``pax`` is this Python's ``pax``, so that the processes run the installation the launcher
    belongs to. The coordinator listens on ``bind`` (an address of this machine; 0.0.0.0 or
    ``::``: every interface).
    """
    if not command:
        raise UsageError("pax launch needs the command to run after --, such as: "
                         "pax launch --processes 2 -- pax train --exp ... --job-dir ...")
    program = str(Path(sys.executable).with_name("pax")) if command[0] == "pax" else command[0]
    if shutil.which(program) is None:
        raise UsageError(f"pax launch: cannot run '{command[0]}': no such program")
    listen, address = _addresses(bind)
    # One queue carries the processes' exits and the launcher's own signals, so the main
    # thread reacts to whichever comes first without polling.
    events: queue.SimpleQueue[tuple[int | None, int]] = queue.SimpleQueue()
    previous = {s: signal.signal(s, lambda signum, _: events.put((None, signum)))
                for s in (signal.SIGINT, signal.SIGTERM)}
    children: list[subprocess.Popen] = []
    try:
        for index in range(processes):
            env = _environment(DistributedOptions(address, processes, index), cpu_devices)
            env[BIND_VARIABLE] = listen
            try:
                children.append(subprocess.Popen(
                    [program, *command[1:]], env=env, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True))
            except OSError as e:
                _signal(children, set(range(len(children))), signal.SIGKILL)
                raise UsageError(f"pax launch: cannot run '{command[0]}': {e.strerror}") from e
        return _supervise(children, events)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _addresses(bind: str) -> tuple[str, str]:
    """``(where the coordinator listens, where the processes reach it)``, both ``HOST:PORT``
    with a port of ``bind`` that is free now; process 0 binds it a moment later (a race a
    shared machine may rarely lose, with a clear error from JAX). The processes reach a
    coordinator that listens on every interface through the loopback interface."""
    try:
        family, kind, _, _, where = socket.getaddrinfo(
            bind, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind) as s:
            s.bind(where)
            port = s.getsockname()[1]
    except OSError as e:
        raise UsageError(f"--bind {bind}: the coordinator cannot listen there ({e.strerror}); "
                         f"give an address of this machine, such as 127.0.0.1 (the default) "
                         f"or 0.0.0.0 (every interface)") from None
    listen = ipaddress.ip_address(where[0])
    reach = listen
    if listen.is_unspecified:
        reach = ipaddress.ip_address("::1" if listen.version == 6 else "127.0.0.1")
    return _host_port(listen, port), _host_port(reach, port)


def _host_port(host: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> str:
    return f"[{host}]:{port}" if host.version == 6 else f"{host}:{port}"


def _environment(options: DistributedOptions, cpu_devices: int | None) -> dict[str, str]:
    env = {**os.environ, **options.as_environment(), "PYTHONUNBUFFERED": "1"}
    if cpu_devices is not None:
        flags = [f for f in env.get("XLA_FLAGS", "").split()
                 if not f.startswith("--xla_force_host_platform_device_count")]
        flags.append(f"--xla_force_host_platform_device_count={cpu_devices}")
        env.update(XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")
    return env


STOPPED = (128 + signal.SIGTERM, 128 + signal.SIGINT)


def _supervise(children: list[subprocess.Popen],
               events: queue.SimpleQueue[tuple[int | None, int]]) -> int:
    """Forward output and wait for every process; stop them all at the first failure or signal.

    ``events`` receives ``(index, exit status)`` for each process and ``(None, signal)`` for
    the launcher's own signals.
    """
    lock = threading.Lock()
    forwarders = {index: [threading.Thread(target=_forward, args=(stream, out, index, lock),
                                           daemon=True)
                          for stream, out in ((child.stdout, sys.stdout),
                                              (child.stderr, sys.stderr))]
                  for index, child in enumerate(children)}
    for index, child in enumerate(children):
        for thread in forwarders[index]:
            thread.start()
        threading.Thread(target=lambda i=index, c=child: events.put((i, c.wait())),
                         daemon=True).start()
    running, code, deadline = set(range(len(children))), 0, None
    while running:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        try:
            index, value = events.get(timeout=timeout)
        except queue.Empty:
            _signal(children, running, signal.SIGKILL)
            deadline = None
            continue
        if index is None:  # the launcher was asked to stop: a second request kills
            stopping = deadline is not None
            code = code or 128 + value
            _signal(children, running, signal.SIGKILL if stopping else value)
            deadline = None if stopping else time.monotonic() + GRACE_S
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
            if running:
                how = f"was killed by signal {-value}" if value < 0 else f"exited with {value}"
                with lock:
                    print(f"pax launch: process {index} {how}; stopping the others",
                          file=sys.stderr, flush=True)
                _signal(children, running, signal.SIGTERM)
                deadline = time.monotonic() + GRACE_S
    return code


def _forward(stream: IO[bytes], out: IO[str], index: int, lock: threading.Lock) -> None:
    after_noise = False
    for raw in stream:
        line = raw.decode(errors="replace").rstrip("\n")
        if _NOISE.search(line) or (after_noise and _FRAGMENT.fullmatch(line)):
            after_noise = True
            continue
        after_noise = False
        with lock:
            print(f"[p{index}] {line}", file=out, flush=True)


def _signal(children: list[subprocess.Popen], indices: set[int], signum: int) -> None:
    """Send ``signum`` to the process group of each child in ``indices``."""
    for index in indices:
        with contextlib.suppress(ProcessLookupError):  # it has just exited
            os.killpg(children[index].pid, signum)
