"""Trial runners: where a sweep's trials train.

A trial is a ``pax train`` command line with its own job directory, so a runner only has to run
command lines somewhere and say when each ends and with what exit status; the sweep does the
rest (choosing, recording, reading metrics). pax-sweep registers ``local``; plugins register
others (``pax_register_trial_runners``), such as pax-ray's, which sends each trial to a Ray
cluster.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pax_core import PluginHost, UsageError

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PRCTL = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None
_ACCELERATORS = {"gpu": "GPU", "tpu": "TPU"}


class TrialRunner:
    """Runs trials, up to ``slots`` at once.

    ``start`` begins one trial (its ``pax train`` arguments, its job directory, the file for
    what it prints, and the resources it needs, as ``trial_resources`` counts them); ``wait``
    returns the trials that ended within ``timeout`` seconds with their exit status (0 trained,
    2 a usage error, 130/143 stopped on request after saving, and so resumable, any other a
    failure); ``cancel`` asks one trial to stop as Ctrl-C asks ``pax train`` (it saves its
    checkpoint; ``wait`` reports its end); ``stop`` asks every running trial and waits for them
    to end.
    """

    slots: int = 1
    # How long ``stop`` lets a trial save its checkpoint before it is killed.
    stop_grace_s: float = 600

    def start(self, trial: str, args: list[str], job_dir: Path, log: Path,
              resources: dict[str, float]) -> None:
        raise NotImplementedError

    def wait(self, timeout: float) -> list[tuple[str, int]]:
        raise NotImplementedError

    def cancel(self, trial: str) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    @staticmethod
    def spawn(args: list[str], job_dir: Path | str, log: Path | str,
              env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start a trial's ``pax train`` here (on the machine the runner put it on): this
        Python's Pax, its output appended to ``log``, in a session of its own (a terminal's
        Ctrl-C reaches the sweep, which stops its trials as it means to), and, on Linux, told
        to stop when the process that started it dies, so a sweep or actor killed outright
        leaves no trial training alone (it saves its checkpoint; the next invocation resumes
        it). ``exit_status`` reads its end."""
        with open(log, "ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "pax_core.cli.main", "train", *args, "--job-dir",
                 str(job_dir)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True, preexec_fn=_stop_with_parent)

    @staticmethod
    def exit_status(code: int) -> int:
        """A process's exit status as a shell gives it: 128 + N for one killed by signal N (a
        trial killed by SIGTERM before ``pax train`` took the signal over is stopped, not
        failed)."""
        return 128 - code if code < 0 else code


class LocalRunner(TrialRunner):
    """Trials as processes of this machine, ``parallel`` at once, each given its share of the
    devices by the platform's backend (``Backend.share``: the CPU's fake devices split,
    pax-gpu's ``CUDA_VISIBLE_DEVICES``)."""

    def __init__(self, host: PluginHost, parallel: int = 1, platform: str | None = None):
        from pax_core import platform_backends  # imports JAX: only where trials run here

        self.slots = parallel
        self._backends = platform_backends(host, platform)
        self._running: dict[str, tuple[int, subprocess.Popen]] = {}

    def _environment(self, slot: int) -> dict[str, str]:
        env = dict(os.environ)
        if self.slots > 1:
            for backend in self._backends:
                env.update(backend.share(slot, self.slots))
        return env

    def start(self, trial: str, args: list[str], job_dir: Path, log: Path,
              resources: dict[str, float]) -> None:
        del resources  # this machine's devices are split evenly (``Backend.share``)
        busy = {slot for slot, _ in self._running.values()}
        slot = min(set(range(self.slots)) - busy)
        self._running[trial] = (slot, self.spawn(args, job_dir, log, self._environment(slot)))

    def wait(self, timeout: float) -> list[tuple[str, int]]:
        deadline = time.monotonic() + timeout
        while True:
            ended = [(t, self.exit_status(p.returncode)) for t, (_, p) in self._running.items()
                     if p.poll() is not None]
            if ended or time.monotonic() >= deadline:
                for trial, _ in ended:
                    del self._running[trial]
                return ended
            time.sleep(0.1)

    def cancel(self, trial: str) -> None:
        process = self._running[trial][1]
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)

    def stop(self) -> None:
        for trial in self._running:
            self.cancel(trial)
        deadline = time.monotonic() + self.stop_grace_s
        for _, process in self._running.values():
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        self._running.clear()


def trial_resources(experiment: Any, platform: str | None) -> dict[str, float]:
    """What one trial needs, in Ray's resource names: a CPU, and on an accelerator platform
    (``--platform`` or ``JAX_PLATFORMS``) as many GPUs or TPU chips as the experiment's mesh
    has devices (one for an experiment that declares no mesh)."""
    from pax_core import accelerator_platform  # imports JAX: only when a sweep starts

    kind = _ACCELERATORS.get(accelerator_platform(platform))
    devices = float(experiment.mesh_size() or 1)
    return {"CPU": 1.0, **({kind: devices} if kind else {})}


def _stop_with_parent() -> None:
    """In the trial, before it runs: SIGTERM when its parent dies (Linux; elsewhere a trial
    outlives its sweep). ``prctl`` was looked up before the fork: a forked child of a threaded
    process may not load libraries."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGTERM)


def runner(host: PluginHost, name: str, parallel: int, platform: str | None) -> TrialRunner:
    """The trial runner registered as ``name``, for ``parallel`` trials at once."""
    entry = host.components("trial_runners").get(name)
    made = entry.build(host, parallel=parallel, platform=platform)
    if not isinstance(made, TrialRunner):
        raise UsageError(f"trial runner {name} made a {type(made).__name__}, not a "
                         f"pax_sweep.TrialRunner")
    return made
