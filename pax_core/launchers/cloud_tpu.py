"""``pax launch --tpu NAME``: one command on every worker of every slice of a Cloud TPU.

Pax's multi-slice recipe used to be one terminal per slice, each typing the same ``gcloud
compute tpus tpu-vm ssh NAME --worker=all --command=...`` at about the same moment. This does
it from one terminal, through Google's own ``gcloud`` (never its API), in four steps:

1. with ``--create ACCELERATOR --runtime VERSION``, queue the slices as one queued resource
   (``--node-count`` for several: slices ``NAME-0`` ... ``NAME-{N-1}``, as the queued
   resource names them) and wait until it is active;
2. read each slice's workers and their addresses (``tpu-vm describe``);
3. check that every worker runs the Pax of this machine (``pax --version``), after
   ``pip install SPEC`` there with ``--install``;
4. run the command on every worker, one ``tpu-vm ssh --worker=W`` each, told the run's
   coordinator (slice 0's worker 0), process count and its index (``PAX_*``, from which the
   multi-slice layout derives libtpu's megascale settings, and the backend its presets).

The ssh sessions are supervised as the processes of a local run are
(``pax_core.launchers.supervise``): each slice's worker 0 is shown, prefixed ``[s<i>w0]``; the
others' last lines are printed if they fail; the first failure, or Ctrl-C, stops all of them.
A signal to a local ssh does not reach the remote process, so stopping also kills each
worker's process by the pid file it wrote (``$TMPDIR/pax-launch-ID-*.pid``, by default in
``/tmp``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from typing import Any

from pax_core.errors import RunError, UsageError
from pax_core.launchers.supervise import Child, supervise
from pax_core.parallel.processes import COORDINATOR_PORT, DistributedOptions

POLL_S = 10
STOP_TIMEOUT_S = 120  # for each slice's workers to be reached with the stop
# Where each worker's process leaves its pid (expanded on the worker).
PID_FOLDER = "${TMPDIR:-/tmp}"
CREATE_TIMEOUT_S = 3600
INSTALL_HINT = ("install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install) and "
                "run gcloud auth login")


@dataclasses.dataclass(frozen=True)
class TpuOptions:
    name: str
    zone: str | None
    project: str | None = None
    slices: int = 1
    create: str | None = None  # an accelerator type to queue, e.g. v4-128
    runtime: str | None = None  # its TPU software version, with create
    install: str | None = None  # a pip requirement to install on every worker first

    def slice_names(self) -> list[str]:
        return [self.name] if self.slices == 1 else [f"{self.name}-{i}"
                                                     for i in range(self.slices)]


@dataclasses.dataclass(frozen=True)
class Slice:
    name: str
    addresses: list[str]  # its workers', in worker order


def _check(command: list[str], options: TpuOptions) -> str:
    """The ``gcloud`` to run, after every check that needs nothing remote."""
    if not command:
        raise UsageError("pax launch --tpu needs the command to run after --, such as: "
                         "pax launch --tpu NAME --zone ZONE -- pax train --exp ...")
    if not options.zone:
        raise UsageError("--tpu needs --zone ZONE (the zone of the TPU, e.g. us-central2-b)")
    if options.slices < 1:
        raise UsageError(f"--slices must be 1 or more, got {options.slices}")
    if (options.create is None) != (options.runtime is None):
        raise UsageError("--create ACCELERATOR and --runtime VERSION go together: the "
                         "accelerator type to queue and its TPU software version (e.g. "
                         "--create v4-128 --runtime tpu-ubuntu2204-base)")
    if options.create is not None:
        from pax_core.speed.hardware import parse_target

        # an accelerator type that does not exist is one line and exit 2
        target = parse_target(options.create, option="--create")
        if target.chip.family != "tpu":
            raise UsageError(f"--create {options.create}: not a TPU accelerator type")
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        raise UsageError(f"pax launch --tpu drives Google's gcloud, which is not on PATH; "
                         f"{INSTALL_HINT}")
    return gcloud


class _Gcloud:
    """``gcloud compute tpus`` for one zone (and project); with ``dry_run``, commands that
    would change something are printed instead of run."""

    def __init__(self, program: str, options: TpuOptions, dry_run: bool):
        self.program, self.options, self.dry_run = program, options, dry_run
        self.where = ["--zone", options.zone] + (["--project", options.project]
                                                 if options.project else [])

    def argv(self, *words: str) -> list[str]:
        return [self.program, "compute", "tpus", *words, *self.where]

    def show(self, *words: str) -> None:
        print(shlex.join(["gcloud", *self.argv(*words)[1:]]), flush=True)

    def run(self, *words: str, reads: bool = False) -> str:
        """Run ``gcloud compute tpus WORDS``; a dry run prints each command and runs only what
        ``reads`` (describes, which change nothing)."""
        argv = self.argv(*words)
        if self.dry_run:
            self.show(*words)
            if not reads:
                return ""
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            said = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise RunError(f"gcloud compute tpus {' '.join(words[:2])} failed: {said}")
        return done.stdout



def _ssh(slice_name: str, worker: str, remote: str) -> list[str]:
    return ["tpu-vm", "ssh", slice_name, f"--worker={worker}", "--command", remote]


def _create(gcloud: _Gcloud, options: TpuOptions) -> None:
    """Queue the slices as one queued resource and wait until it is active."""
    nodes = (["--node-id", options.name] if options.slices == 1 else
             ["--node-count", str(options.slices), "--node-prefix", options.name])
    gcloud.run("queued-resources", "create", options.name, "--accelerator-type",
               options.create, "--runtime-version", options.runtime, *nodes)
    if gcloud.dry_run:
        return
    deadline, last = time.monotonic() + CREATE_TIMEOUT_S, None
    while time.monotonic() < deadline:
        state = gcloud.run("queued-resources", "describe", options.name,
                           "--format=value(state.state)", reads=True).strip()
        if state != last:
            print(f"pax launch: queued resource {options.name}: {state}", flush=True)
            last = state
        if state == "ACTIVE":
            return
        if state in ("FAILED", "SUSPENDED"):
            raise RunError(f"queued resource {options.name} is {state}; see gcloud compute "
                           f"tpus queued-resources describe {options.name}")
        time.sleep(POLL_S)
    raise RunError(f"queued resource {options.name} not active after {CREATE_TIMEOUT_S} s")


def _slices(gcloud: _Gcloud, options: TpuOptions) -> list[Slice]:
    """Each slice's workers' addresses (read-only, so also in a dry run, unless the slices
    are yet to be created: then their count from the accelerator type, and in place of each
    address ``NAME.worker-W``)."""
    if gcloud.dry_run and options.create:
        from pax_core.speed.hardware import parse_target

        for name in options.slice_names():
            gcloud.show("tpu-vm", "describe", name, "--format=json")
        target = parse_target(options.create, option="--create")
        hosts = max(1, target.chips // target.chip.chips_per_host)
        return [Slice(name, [f"{name}.worker-{w}" for w in range(hosts)])
                for name in options.slice_names()]
    found = []
    for name in options.slice_names():
        described: dict[str, Any] = json.loads(gcloud.run("tpu-vm", "describe", name,
                                                          "--format=json", reads=True))
        addresses = [e.get("ipAddress", "") for e in described.get("networkEndpoints", [])]
        if not addresses:
            raise RunError(f"TPU {name} has no workers yet (its state: "
                           f"{described.get('state', 'unknown')})")
        found.append(Slice(name, addresses))
    if len({len(s.addresses) for s in found}) > 1:
        raise RunError("the slices have different numbers of workers: "
                       + ", ".join(f"{s.name} {len(s.addresses)}" for s in found))
    return found


def _check_software(gcloud: _Gcloud, slices: list[Slice], install: str | None) -> None:
    """Every worker answers ``pax --version`` as this machine does."""
    from pax_core import API_VERSION, __version__

    ours = f"pax {__version__} (plugin API {API_VERSION})"
    for one in slices:
        if install:
            gcloud.run(*_ssh(one.name, "all", f"pip install -q {shlex.quote(install)}"))
        said = gcloud.run(*_ssh(one.name, "all", "pax --version"))
        if gcloud.dry_run:
            continue
        answers = [line.strip() for line in said.splitlines() if line.strip().startswith("pax")]
        wrong = [a for a in answers if a != ours]
        if wrong or len(answers) < len(one.addresses):
            found = wrong[0] if wrong else f"{len(answers)} of {len(one.addresses)} answers"
            raise UsageError(f"TPU {one.name}: its workers run {found!r}, this machine "
                             f"{ours!r}; pass --install 'pax-core=={__version__} ...' (the "
                             f"packages this run needs) or install them there")


def _remote(command: list[str], options: DistributedOptions, pid_file: str) -> str:
    """What a worker runs: its pid written where a stop finds it, then the command with the
    run's distributed settings."""
    settings = " ".join(f"{k}={shlex.quote(v)}" for k, v in options.as_environment().items())
    return (f"echo $$ > {pid_file}; exec env PYTHONUNBUFFERED=1 {settings} "
            f"{shlex.join(command)}")


def launch(command: list[str], options: TpuOptions, dry_run: bool = False) -> int:
    """Run ``command`` on every worker of the slices; returns the exit code for the launcher."""
    gcloud = _Gcloud(_check(command, options), options, dry_run)
    if options.create:
        _create(gcloud, options)  # a dry run prints the create, not the wait
    slices = _slices(gcloud, options)
    _check_software(gcloud, slices, options.install)
    workers = len(slices[0].addresses)
    coordinator = f"{slices[0].addresses[0]}:{COORDINATOR_PORT}"
    launch_id = uuid.uuid4().hex[:8]
    children = []
    for s, one in enumerate(slices):
        for w in range(workers):
            pid_file = f"{PID_FOLDER}/pax-launch-{launch_id}-s{s}w{w}.pid"
            joined = DistributedOptions(coordinator, workers * len(slices), s * workers + w)
            argv = gcloud.argv(*_ssh(one.name, str(w), _remote(command, joined, pid_file)))
            children.append(Child(f"s{s}w{w}", f"slice {s} worker {w}", argv,
                                  dict(os.environ), shown=w == 0))
    if dry_run:
        for child in children:
            print(shlex.join(["gcloud", *child.argv[1:]]))
        return 0
    print(f"pax launch: {len(children)} processes on {len(slices)} slice(s) of {workers} "
          f"worker(s), coordinator {coordinator}; showing each slice's worker 0", flush=True)

    def stop_remote() -> None:
        files = f"{PID_FOLDER}/pax-launch-{launch_id}-*.pid"
        kill = f"kill -TERM $(cat {files} 2>/dev/null) 2>/dev/null; rm -f {files}; true"
        unreached = []
        for one in slices:
            try:
                subprocess.run(gcloud.argv(*_ssh(one.name, "all", kill)), capture_output=True,
                               stdin=subprocess.DEVNULL, timeout=STOP_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                unreached.append(one.name)
        print("pax launch: asked every worker's process to stop" + (
            f"; {', '.join(unreached)} did not answer in {STOP_TIMEOUT_S} s: check them with "
            f"gcloud compute tpus tpu-vm ssh NAME --worker=all" if unreached else ""),
            file=sys.stderr, flush=True)

    return supervise(children, on_stop=stop_remote)
