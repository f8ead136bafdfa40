"""Joining a multi-process run: JAX's distributed runtime, started before the backend.

Every process of a run runs the same command with three settings: ``--coordinator-address
HOST:PORT`` (process 0's host and a free port, where JAX's coordination service listens),
``--num-processes N`` and ``--process-id I``, or the environment variables
``PAX_COORDINATOR_ADDRESS``, ``PAX_NUM_PROCESSES`` and ``PAX_PROCESS_ID`` (the command line
wins). ``--num-processes 1`` alone means one process. Without any of them, a cluster that JAX
knows how to read (SLURM, Open MPI, Cloud TPU, Kubernetes) is joined when its environment is
present and counts more than one process; otherwise the run is one process and nothing happens.

A run must end, not hang, when one of its processes dies. The bounds:

* Joining: a process waits at most ``INITIALIZATION_TIMEOUT_S`` (5 min) for all the others to
  connect, since the hosts of one job can start minutes apart.
* A process that fails with an error waits at most ``FAILURE_GRACE_S`` (5 s) at JAX's shutdown
  barrier, so that processes failing together (a mistake every process finds) exit cleanly, and
  then exits without the others. Waiting for JAX's whole shutdown timeout instead would keep the
  others blocked in a collective with it for minutes. The same grace bounds the wait for a
  library's worker threads, also in a run of one process.
* A process that sends no heartbeat for ``HEARTBEAT_TIMEOUT_S`` (1 min), having failed, been
  killed or lost its host, is declared dead by the coordination service, which then terminates
  every other process ("the JAX distributed service detected fatal errors"). Their pending
  collective may fail sooner (gloo on CPU can report "connection closed by peer").
* At a successful end, processes wait up to ``SHUTDOWN_TIMEOUT_S`` (5 min) for each other, since
  process 0 still writes logs and runs the plugins' end-of-run hooks.
* On CPU, the exchange of device topologies at start-up gives up after 1 min (JAX: 2).

So once a process fails, every process has ended within ``FAILURE_GRACE_S +
HEARTBEAT_TIMEOUT_S`` (65 s); ``pax launch`` ends the others within seconds.

This module imports JAX only inside its functions: the command line parses the options before
JAX is needed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import sys
import threading
import time
import warnings
from typing import TYPE_CHECKING, NoReturn

from pax_core.errors import RunError, UsageError
from pax_core.plugins.versions import library_versions

if TYPE_CHECKING:
    from pax_core.plugins.host import PluginHost

INITIALIZATION_TIMEOUT_S = 300
HEARTBEAT_TIMEOUT_S = 60
SHUTDOWN_TIMEOUT_S = 300
FAILURE_GRACE_S = 5
CPU_TOPOLOGY_TIMEOUT_MIN = 1
# Where a cluster launcher has process 0 serve the coordinator: the port JAX itself uses on
# Cloud TPU clusters.
COORDINATOR_PORT = 8476

ADDRESS, NUM_PROCESSES, PROCESS_ID = "--coordinator-address", "--num-processes", "--process-id"
ENV = {ADDRESS: "PAX_COORDINATOR_ADDRESS", NUM_PROCESSES: "PAX_NUM_PROCESSES",
       PROCESS_ID: "PAX_PROCESS_ID"}


def parse_count(value: str, option: str, minimum: int) -> int:
    """An integer ``option`` of at least ``minimum``, or a one-line ``UsageError`` naming it."""
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or number < minimum:
        raise UsageError(f"{option} must be an integer >= {minimum}, got '{value}'")
    return number


def _check_address(value: str, label: str) -> str:
    host, colon, port = value.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{label} must be HOST:PORT (process 0's host and a free port), "
                         f"got '{value}'")
    return value


@dataclasses.dataclass(frozen=True)
class DistributedOptions:
    """How this process joins a run; all None: whatever the environment says."""

    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None

    @classmethod
    def parse(cls, coordinator_address: str | None = None, num_processes: str | None = None,
              process_id: str | None = None) -> DistributedOptions:
        """Check command-line values, each falling back to its environment variable."""
        given: dict[str, tuple[str, str]] = {}  # option: (value, where it was given)
        for option, value in ((ADDRESS, coordinator_address), (NUM_PROCESSES, num_processes),
                              (PROCESS_ID, process_id)):
            if value is not None:
                given[option] = (value, option)
            elif os.environ.get(ENV[option]):
                given[option] = (os.environ[ENV[option]], ENV[option])
        count = parse_count(*given[NUM_PROCESSES], 1) if NUM_PROCESSES in given else None
        missing = [o for o in (ADDRESS, NUM_PROCESSES, PROCESS_ID) if o not in given]
        if given and missing and count != 1:
            raise UsageError(
                f"{' and '.join(label for _, label in given.values())} without "
                f"{' and '.join(f'{o} (or {ENV[o]})' for o in missing)}: a multi-process run "
                f"needs all three")
        address = _check_address(*given[ADDRESS]) if ADDRESS in given else None
        index = parse_count(*given[PROCESS_ID], 0) if PROCESS_ID in given else None
        if index is not None and count is not None and index >= count:
            raise UsageError(f"{given[PROCESS_ID][1]} must be below the number of processes "
                             f"({count}), got {index}")
        return cls(address, count, index)

    def as_environment(self) -> dict[str, str]:
        """The environment variables that make a process join with these options."""
        values = (self.coordinator_address, self.num_processes, self.process_id)
        return {ENV[o]: str(v) for o, v in zip(ENV, values, strict=True) if v is not None}


def join_processes(options: DistributedOptions | None = None) -> None:
    """Join the other processes of this run, if there are any.

    Must run before JAX starts its backend (``jax.devices()``, any computation): the backend
    takes the distributed client and, on CPU, its gloo collectives when it starts.
    """
    import jax

    if jax.distributed.is_initialized():
        return
    options = options or DistributedOptions.parse()
    if options.num_processes == 1:
        return
    where = options.coordinator_address
    if options.num_processes is None:
        where = detected_cluster()
        if where is None:
            return
    elif options.process_id == 0:
        _check_port_free(options.coordinator_address)
    try:
        jax.distributed.initialize(
            coordinator_address=options.coordinator_address,
            num_processes=options.num_processes,
            process_id=options.process_id,
            initialization_timeout=INITIALIZATION_TIMEOUT_S,
            heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S,
            shutdown_timeout_seconds=SHUTDOWN_TIMEOUT_S,
        )
    except RuntimeError as e:
        raise RunError(f"could not join the other processes ({where}): "
                       f"{str(e).splitlines()[0]}") from e
    jax.config.update("jax_cpu_get_local_topology_timeout_minutes", CPU_TOPOLOGY_TIMEOUT_MIN)
    jax.config.update("jax_cpu_get_global_topology_timeout_minutes", CPU_TOPOLOGY_TIMEOUT_MIN + 1)


def _check_port_free(address: str) -> None:
    """Process 0 serves the coordinator on every interface at the address's port; JAX crashes
    (a segmentation fault) when that port is taken, so check it first."""
    port = int(address.rpartition(":")[2])
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError as e:
            raise UsageError(f"{ADDRESS} {address}: port {port} is taken on process 0's host "
                             f"({e.strerror}); choose another port") from e


def detected_cluster() -> str | None:
    """The cluster JAX would join without options, if it counts more than one process.

    JAX has no public way to ask, so this walks the cluster types ``jax.distributed.initialize``
    itself tries, in its order. A one-process allocation (an interactive SLURM shell) stays a
    plain process: joining would only claim a port that a second command in the job then lacks.
    """
    from jax._src import clusters

    with warnings.catch_warnings():
        # A Kubernetes pod without the ``kubernetes`` package is a pod, not a JAX job.
        warnings.simplefilter("ignore")
        found = next((c for c in clusters.ClusterEnv._cluster_types
                      if not c.opt_in_only_method and c.is_env_present()), None)
    if found is None:
        return None
    name = found.name or found.__name__
    try:
        count = _tpu_hosts_from_environment(name)
        if count is None:
            count = found.get_process_count()
    except Exception as e:
        raise UsageError(f"found a {name} cluster but not its number of processes "
                         f"({type(e).__name__}: {e}); give the three distributed options, or "
                         f"{NUM_PROCESSES} 1 for one process") from e
    return f"{name} cluster" if count > 1 else None


def _tpu_hosts_from_environment(cluster: str) -> int | None:
    """A TPU VM's process count from its environment alone, where the environment holds it:
    its slice's hosts (``TPU_PROCESS_ADDRESSES`` or ``TPU_WORKER_HOSTNAMES``) times the slices
    (``MEGASCALE_NUM_SLICES``, 1 when unset). JAX asks the metadata server for an unset slice
    count, and a one-host TPU VM may have none (``TPU_SKIP_MDS_QUERY``): asked there, it would
    fail to start a run that is plainly one process. None for another cluster, or a TPU VM
    whose environment does not list its hosts."""
    if cluster != "gketpu":
        return None
    hosts = os.environ.get("TPU_PROCESS_ADDRESSES") or os.environ.get("TPU_WORKER_HOSTNAMES")
    if not hosts:
        return None
    slices = os.environ.get("MEGASCALE_NUM_SLICES") or "1"
    return len([h for h in hosts.split(",") if h.strip()]) * int(slices)


def check_same_software(host: PluginHost) -> None:
    """Stop every process if they did not all load the same plugins and library versions.

    Processes that build different experiments, models or inputs would train on mismatched
    programs without any error, so this runs once the backend is up, on every process (it is a
    collective), and each process raises the same ``UsageError``.
    """
    import jax

    if jax.process_count() == 1:
        return
    mine = {f"plugin {n}": v for n, v in host.active_versions().items()}
    mine.update(library_versions())
    loaded = [json.loads(b) for b in _allgather_bytes(json.dumps(mine).encode())]
    differences = []
    for key in sorted(set().union(*loaded)):
        holders: dict[str, list[int]] = {}
        for process, versions in enumerate(loaded):
            holders.setdefault(versions.get(key, "not loaded"), []).append(process)
        if len(holders) > 1:
            differences.append(f"{key} is " + ", ".join(
                f"{value} on {_processes(ids)}" for value, ids in holders.items()))
    if differences:
        more = f" (and {len(differences) - 3} more)" if len(differences) > 3 else ""
        raise UsageError(f"the processes of this run loaded different software: "
                         f"{'; '.join(differences[:3])}{more}; install the same plugins and "
                         f"versions on every host, with the same PAX_PLUGINS/PAX_DISABLE_PLUGINS")


def from_primary(message: str | None) -> str | None:
    """Process 0's ``message`` on every process (a collective in a multi-process run): how a
    check that only process 0 can make, such as the job directory's lock, stops them all."""
    import jax

    if jax.process_count() == 1:
        return message
    first = _allgather_bytes((message or "").encode())[0].decode()
    return first or None


def _allgather_bytes(data: bytes) -> list[bytes]:
    """Every process's ``data``, in process order."""
    import numpy as np
    from jax.experimental import multihost_utils

    sizes = multihost_utils.process_allgather(np.int32(len(data)))
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:len(data)] = np.frombuffer(data, np.uint8)
    rows = multihost_utils.process_allgather(padded)
    return [row[:size].tobytes() for row, size in zip(rows, sizes, strict=True)]


def _processes(ids: list[int]) -> str:
    if len(ids) == 1:
        return f"process {ids[0]}"
    shown = ", ".join(map(str, ids[:3]))
    return f"processes {shown}" + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")


def exit_after_failure(code: int) -> NoReturn:
    """End this process after an error, without waiting long for the others or for threads.

    In a multi-process run JAX's exit waits at the shutdown barrier for every process, up to
    ``SHUTDOWN_TIMEOUT_S``, while the others may be blocked in a collective with this one: a
    failure alone would stall the run for minutes. And a library's worker threads may wait for
    work that will never come (Orbax's save threads wait 5 minutes for a save that failed
    early). The barrier and the threads get ``FAILURE_GRACE_S`` together, enough for processes
    that fail together and threads that are finishing; then the process exits regardless.
    """
    deadline = time.monotonic() + FAILURE_GRACE_S
    jax = sys.modules.get("jax")
    joined = jax is not None and jax.distributed.is_initialized()
    if joined:
        barrier = threading.Thread(target=jax.distributed.shutdown, daemon=True)
        barrier.start()
        barrier.join(FAILURE_GRACE_S)
    waiting = [t for t in threading.enumerate()
               if t is not threading.current_thread() and not t.daemon]
    for thread in waiting:
        with contextlib.suppress(Exception):  # Orbax's threads raise when time is up
            thread.join(max(0.0, deadline - time.monotonic()))
    if not joined and not any(t.is_alive() for t in waiting):
        sys.exit(code)  # an ordinary exit: nothing is left to wait for
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
