"""``pax launch --processes N``: one command as the N processes of a multi-process run on this
machine.

For development and tests: the processes are told what a cluster would tell them (the
coordinator address, here 127.0.0.1 with a free port, the process count and their index,
through ``PAX_COORDINATOR_ADDRESS``, ``PAX_NUM_PROCESSES`` and ``PAX_PROCESS_ID``), so
``pax launch --processes 2 -- pax train ...`` runs exactly what two hosts would. JAX's
coordination service, which process 0 serves, listens on every network interface unless told
otherwise; the processes here reach it on this machine, so it is told to listen on 127.0.0.1
only (``JAX_COORDINATOR_BIND_ADDRESS``), out of other hosts' reach, unless ``--bind`` names
another address of this machine.

The processes are supervised together (``pax_core.launchers.supervise``): output prefixed
with ``[p<i>]``, the first failure or a stop asked of the launcher stopping all of them.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import sys
from pathlib import Path

from pax_core.backends.cpu import with_device_count
from pax_core.errors import UsageError
from pax_core.launchers.supervise import Child, supervise
from pax_core.parallel.processes import DistributedOptions

# Where JAX's coordination service listens (jax.distributed.initialize reads it): set for
# every process, so that one in the launcher's environment cannot name another port.
BIND_VARIABLE = "JAX_COORDINATOR_BIND_ADDRESS"


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
    children = []
    for index in range(processes):
        env = _environment(DistributedOptions(address, processes, index), cpu_devices)
        env[BIND_VARIABLE] = listen
        children.append(Child(f"p{index}", f"process {index}", [program, *command[1:]], env))
    return supervise(children)


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
        env.update(XLA_FLAGS=with_device_count(env.get("XLA_FLAGS", ""), cpu_devices),
                   JAX_PLATFORMS="cpu")
    return env


