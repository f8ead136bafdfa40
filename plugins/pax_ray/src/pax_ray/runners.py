"""``pax sweep --runner ray``: each trial a Ray actor on the cluster at ``RAY_ADDRESS``.

The actor holds the resources the trial declares (a CPU, and the GPUs or TPU chips of its
experiment's mesh), so Ray places it on a node that has them and queues it until one does; it
runs the trial's ``pax train`` there as a process of its own, and stops it as Ctrl-C stops
``pax train`` (it saves its checkpoint). The sweep directory must be on a file system every
node mounts at the same path. The sweep's ``PAX_*``,
``JAX_*``, ``XLA_*``, ``LIBTPU_*`` and ``NCCL_*`` variables go with each trial. A trial whose
node is lost counts as stopped, not failed: the sweep starts it again (a few times), and it
resumes; a trial whose actor dies takes its ``pax train`` with it (it saves and stops, as
``TrialRunner.spawn`` sets up).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
from pathlib import Path
from typing import Any

import ray

from pax_core import UsageError
from pax_sweep import TrialRunner

PASSED_ON = ("PAX_", "JAX_", "XLA_", "LIBTPU_", "NCCL_")
_LOST = 143  # a trial whose actor or node died: resumable, as a trial stopped on request
_FAILED = 1


class TrialProcess:
    """The Ray actor of one trial: its ``pax train`` process, and the way to stop it."""

    def __init__(self) -> None:
        self._process: subprocess.Popen | None = None
        self._stopped = False
        self._lock = threading.Lock()  # run and stop come on two threads of the actor

    def run(self, args: list[str], job_dir: str, log: str) -> int:
        """Train the trial on this node; returns ``pax train``'s exit status."""
        Path(job_dir).mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as out:
            out.write(f"pax-ray: trial on {socket.gethostname()}, Ray node "
                      f"{ray.get_runtime_context().get_node_id()}\n".encode())
            out.flush()
        with self._lock:
            if self._stopped:
                return _LOST
            self._process = TrialRunner.spawn(args, job_dir, log)
        return TrialRunner.exit_status(self._process.wait())

    def stop(self) -> None:
        """Ask the trial to stop (it saves its checkpoint); ``run`` then returns."""
        with self._lock:
            self._stopped = True
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
        self._checked: set[tuple[tuple[str, float], ...]] = set()

    def _check_fits(self, resources: dict[str, float]) -> None:
        """Refuse a trial that no node of the cluster could hold (Ray would queue it for
        ever); an autoscaling cluster must have such a node up when the sweep starts."""
        key = tuple(sorted(resources.items()))
        if key in self._checked:
            return
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        if not any(all(node.get(k, 0.0) >= v for k, v in resources.items()) for node in nodes):
            most = {k: max((node.get(k, 0.0) for node in nodes), default=0.0)
                    for k in resources}
            raise UsageError(
                f"a trial needs {', '.join(f'{k} {v:g}' for k, v in resources.items())} on one "
                f"node, and the Ray cluster's nodes have at most "
                f"{', '.join(f'{k} {v:g}' for k, v in most.items())}; add such a node, or sweep "
                f"an experiment with a smaller mesh")
        self._checked.add(key)

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
        """The trial's exit status; a lost actor or node is a stop (the trial resumes), any
        other failure of Ray's a failed trial."""
        try:
            return int(ray.get(ref))
        except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                ray.exceptions.NodeDiedError, ray.exceptions.TaskCancelledError):
            return _LOST
        except ray.exceptions.RayError:
            return _FAILED

    def cancel(self, trial: str) -> None:
        self._running[trial][0].stop.remote()

    def stop(self) -> None:
        for trial in self._running:
            self.cancel(trial)
        refs = [ref for _, ref in self._running.values()]
        ray.wait(refs, num_returns=len(refs), timeout=self.stop_grace_s)
        for actor, _ in self._running.values():
            ray.kill(actor)  # one not yet placed, or still saving past the grace
        self._running.clear()
