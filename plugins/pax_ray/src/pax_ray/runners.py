"""``pax sweep --runner ray``: each trial a Ray actor on the cluster at ``RAY_ADDRESS``.

The actor holds the resources the trial declares (a CPU, and the GPUs or TPU chips of its
experiment's mesh), so Ray places it on a node that has them and queues it until one does; it
runs the trial's ``pax train`` there as a process of its own, and stops it as Ctrl-C stops
``pax train`` (it saves its checkpoint). The job directories must be where every node reaches
them: a shared file system, or a ``gs://`` sweep's trials in a bucket. The sweep's ``PAX_*``,
``JAX_*``, ``XLA_*``, ``LIBTPU_*`` and ``NCCL_*`` variables go with each trial. A trial whose
node is lost counts as stopped, not failed: the sweep starts it again, and it resumes.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import ray

from pax_core import TrialRunner, UsageError

PASSED_ON = ("PAX_", "JAX_", "XLA_", "LIBTPU_", "NCCL_")
_LOST = 143  # a trial whose actor or node died: resumable, as a trial stopped on request


class TrialProcess:
    """The Ray actor of one trial: its ``pax train`` process, and the way to stop it."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()

    def run(self, args: list[str], job_dir: str, log: str) -> int:
        """Train the trial on this node; returns ``pax train``'s exit status."""
        pax = str(Path(sys.executable).with_name("pax"))
        Path(job_dir).mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            out.write(f"pax-ray: trial on {socket.gethostname()}, Ray node "
                      f"{ray.get_runtime_context().get_node_id()}\n".encode())
            out.flush()
            with self._lock:
                if self._stopped.is_set():
                    return _LOST
                self._process = subprocess.Popen(
                    [pax, "train", *args, "--job-dir", job_dir], stdout=out,
                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        return self._process.wait()

    def stop(self) -> None:
        """Ask the trial to stop (it saves its checkpoint); ``run`` then returns."""
        with self._lock:
            self._stopped.set()
            if self._process is not None and self._process.poll() is None:
                os.killpg(self._process.pid, signal.SIGTERM)


class RayRunner(TrialRunner):
    """Trials as Ray actors, ``parallel`` submitted at once (Ray queues those the cluster has
    no room for yet)."""

    def __init__(self, host: Any, parallel: int = 1, platform: str | None = None):
        del host, platform  # the platform reaches the trials through their resources
        self.slots = parallel
        address = os.environ.get("RAY_ADDRESS")
        try:
            ray.init(address=address, log_to_driver=False,
                     runtime_env={"env_vars": {k: v for k, v in os.environ.items()
                                               if k.startswith(PASSED_ON)}})
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise UsageError(f"--runner ray: no Ray cluster at {address or 'this machine'} "
                             f"({str(e).splitlines()[0]}); start one (ray start --head) and "
                             f"set RAY_ADDRESS to its address") from None
        self._actor = ray.remote(TrialProcess)
        self._running: dict[str, tuple[Any, ray.ObjectRef]] = {}

    def _check_fits(self, resources: dict[str, float]) -> None:
        """Refuse a trial no node could ever hold (Ray would queue it for ever)."""
        cluster = ray.cluster_resources()
        short = {k: v for k, v in resources.items() if cluster.get(k, 0.0) < v}
        if short:
            have = ", ".join(f"{k} {cluster.get(k, 0):g}" for k in short)
            raise UsageError(f"a trial needs {', '.join(f'{k} {v:g}' for k, v in short.items())}"
                             f" and the Ray cluster has {have} in all; add nodes that have "
                             f"them, or sweep an experiment with a smaller mesh")

    def start(self, trial: str, args: list[str], job_dir: Path, log: Path,
              resources: dict[str, float]) -> None:
        self._check_fits(resources)
        others = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
        actor = self._actor.options(
            num_cpus=resources.get("CPU", 1.0), num_gpus=resources.get("GPU", 0.0),
            resources=others, max_concurrency=2).remote()
        self._running[trial] = (actor, actor.run.remote(args, str(job_dir), str(log)))

    def wait(self, timeout: float) -> list[tuple[str, int]]:
        if not self._running:
            return []
        names = {ref: name for name, (_, ref) in self._running.items()}
        ready, _ = ray.wait(list(names), num_returns=1, timeout=timeout)
        if ready:  # and whatever else has ended meanwhile
            ready, _ = ray.wait(list(names), num_returns=len(names), timeout=0)
        ended = []
        for ref in ready:
            name = names[ref]
            ended.append((name, self._result(ref)))
            ray.kill(self._running.pop(name)[0])
        return ended

    @staticmethod
    def _result(ref: ray.ObjectRef) -> int:
        try:
            return int(ray.get(ref))
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                ray.exceptions.NodeDiedError):
            return _LOST

    def cancel(self, trial: str) -> None:
        self._running[trial][0].stop.remote()

    def stop(self) -> None:
        for trial in self._running:
            self.cancel(trial)
        for actor, ref in self._running.values():
            self._result(ref)
            ray.kill(actor)
        self._running.clear()
