"""``pax launch --slurm``: one command as the tasks of a SLURM batch job, followed to its end.

The launcher writes an ``sbatch`` script whose one step is ``srun`` running the command once
per task (by default one task per GPU, or one per node), submits it and stays with the job: it
prints the job's output as it grows and exits with the job's exit code, as a local launch does.
Each task needs no Pax-specific environment: ``pax train`` finds SLURM's variables and joins
the other tasks through JAX's own SLURM support (``pax_core.parallel.processes``). The
launcher's environment reaches the tasks, since ``sbatch`` and ``srun`` export it by default.

The script and the job's output are kept in a folder ``pax-launch-<time>/`` of the current
directory, which must be on a file system the nodes share (as a SLURM home or project folder
is): the job writes its output there and the launcher reads it. Ctrl-C or SIGTERM to the
launcher cancels the job: a job left running after its launcher was stopped would hold nodes
nobody watches.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from pax_core.errors import UsageError
from pax_core.launchers.supervise import STOPPED, NoiseFilter

# The job's output is a file on a shared file system: reading it is cheap, so it is read often.
OUTPUT_POLL_S = 0.5
# Each queue check is a request to slurmctld, which a cluster's users share: after a quick
# first look, the checks thin out to one every QUEUE_POLL_MAX_S while the job runs.
QUEUE_POLL_MAX_S = 5.0
_NO_VALUE = re.compile(r"\s")
_LABEL = re.compile(r"^ *\d+: ")  # srun --label's task number
# srun's line for tasks that exited with a nonzero code, as it learns of them.
_TASK_FAILED = re.compile(r"srun: error: \S+: tasks? [\d,-]+: Exited with exit code (\d+)$")


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
    """The job's resources and where it runs (``sbatch``'s options of the same names)."""

    partition: str | None
    nodes: int = 1
    gpus_per_node: int | None = None
    tasks_per_node: int | None = None  # processes per node; default: one per GPU, or 1
    time: str | None = None  # SLURM's format, such as 4:00:00 or 2-00:00:00
    account: str | None = None
    sbatch_args: tuple[str, ...] = ()  # more "#SBATCH" lines, each like "--qos=high"
    job_name: str = "pax"


def script(command: list[str], options: SlurmOptions, output: str) -> str:
    """The ``sbatch`` script that runs ``command`` once per task, writing to ``output``.

    A first word ``pax`` becomes this Python's ``pax``, so that the job runs the installation
    the launcher belongs to (the nodes see it on the shared file system)."""
    program = str(Path(sys.executable).with_name("pax")) if command[0] == "pax" else command[0]
    shown = shlex.join(command).replace("\n", "\\n")  # a comment line stays one line
    tasks = options.tasks_per_node or options.gpus_per_node or 1
    directives = [f"--job-name={options.job_name}", f"--nodes={options.nodes}",
                  f"--ntasks-per-node={tasks}"]
    if options.gpus_per_node is not None:
        directives.append(f"--gpus-per-node={options.gpus_per_node}")
    directives.append(f"--partition={options.partition}")
    if options.time is not None:
        directives.append(f"--time={options.time}")
    if options.account is not None:
        directives.append(f"--account={options.account}")
    directives += [*options.sbatch_args, f"--output={output}"]
    return "\n".join([
        "#!/bin/bash",
        *(f"#SBATCH {d}" for d in directives),
        "# Written by pax launch --slurm: one step running, once per task,",
        f"#   {shown}",
        "# Each task finds SLURM's variables and joins the others as one run.",
        "# Python writes each line as it prints it, so the launcher can follow this job's output.",
        "export PYTHONUNBUFFERED=1",
        # --label prefixes each line with its task's number; --kill-on-bad-exit stops the
        # step at the first failing task, as the run cannot go on without it.
        f"srun --kill-on-bad-exit=1 --label {shlex.join([program, *command[1:]])}",
        "",
    ])


def launch(command: list[str], options: SlurmOptions, dry_run: bool = False) -> int:
    """Submit ``command`` as a SLURM job and follow it; returns the exit code for the launcher
    (the job's, 128 + N when it was stopped by signal N). ``dry_run`` prints the script only."""
    _check(command, options)
    if dry_run:
        print(script(command, options, "pax-launch-<time>/job.out"), end="")
        return 0
    folder = _new_folder()
    output = folder / "job.out"
    path = folder / "job.sbatch"
    path.write_text(script(command, options, str(output)))
    submitted = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True,
                               text=True, stdin=subprocess.DEVNULL)
    if submitted.returncode != 0:
        why = (submitted.stderr.strip().splitlines() or ["no message"])[-1]
        raise UsageError(f"pax launch: sbatch refused the job ({why}); fix the options and "
                         f"launch again (the script is {path})")
    job = submitted.stdout.strip().split(";")[0]  # "ID" or "ID;CLUSTER"
    _say(f"submitted SLURM job {job}; its script and output are in {folder}/")
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        last_seen, failure = _follow(job, output)
    except _Interrupted as stop:
        cancelled = subprocess.run(["scancel", job], capture_output=True, text=True,
                                   stdin=subprocess.DEVNULL)
        name = signal.Signals(stop.signum).name
        if cancelled.returncode == 0:
            _say(f"stopped by {name}: cancelled SLURM job {job}")
        else:
            _say(f"stopped by {name}, but scancel failed ({cancelled.stderr.strip()}); the "
                 f"job may still run: cancel it with scancel {job}")
        return 128 + stop.signum
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    state, code = _final_state(job, last_seen)
    if code in STOPPED and failure:
        # srun stopped the other tasks at the first failure, and reports the highest code of
        # all: theirs, as stopped by a signal. The launcher's code is the failure's, as a
        # local launch's is, so that a run that failed does not read as preempted.
        code = failure
    _say(f"SLURM job {job} ended {state}" + (f" (exit code {code})" if code else ""))
    return code


def _check(command: list[str], options: SlurmOptions) -> None:
    """Refuse what sbatch would refuse later, or misread: one line naming what to change."""
    if not command:
        raise UsageError("pax launch needs the command to run after --, such as: pax launch "
                         "--slurm --partition P -- pax train --exp ... --job-dir ...")
    if options.partition is None:
        raise UsageError("--slurm needs --partition P (sinfo lists them)")
    for name, count in (("--nodes", options.nodes), ("--gpus-per-node", options.gpus_per_node),
                        ("--tasks-per-node", options.tasks_per_node)):
        if count is not None and count < 1:
            raise UsageError(f"{name} must be an integer >= 1, got '{count}'")
    for name, value in (("--partition", options.partition), ("--time", options.time),
                        ("--account", options.account), ("--job-name", options.job_name)):
        if value is not None and (not value or _NO_VALUE.search(value)):
            raise UsageError(f"{name} must be one word without spaces, got {value!r}")
    for arg in options.sbatch_args:
        if not arg.startswith("-") or "\n" in arg:
            raise UsageError(f"each extra sbatch argument must be one option such as "
                             f"--qos=high, got {arg!r}")
    if shutil.which("sbatch") is None:
        raise UsageError("pax launch --slurm needs SLURM's sbatch on PATH "
                         "(on Debian: apt install slurm-client)")


def _new_folder() -> Path:
    """``pax-launch-<time>/`` in the current directory, new even for two launches a second."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for attempt in range(100):
        folder = Path.cwd() / f"pax-launch-{stamp}{f'-{attempt}' if attempt else ''}"
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise UsageError(f"pax launch: too many pax-launch-{stamp}* folders in {Path.cwd()}")


class _Interrupted(Exception):
    """The launcher was asked to stop: raised by its signal handler, in the main thread, to
    leave whatever it was waiting for."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum: int, _frame: object) -> None:
    raise _Interrupted(signum)


def _say(message: str) -> None:
    print(f"pax launch: {message}", file=sys.stderr, flush=True)


def _follow(job: str, output: Path) -> tuple[str | None, int | None]:
    """Print the job's output as it grows until the job leaves the queue; returns the state
    it was last seen in (what is left to say when SLURM has forgotten the job at its end) and
    the exit code of the first task that failed, if one did."""
    shown = _Output(job, output)
    last_seen, wait, next_check = None, 1.0, 0.0
    while True:
        shown.print_new()
        if time.monotonic() >= next_check:
            state = _queue_state(job)
            if state == "":
                break
            last_seen = state or last_seen
            next_check, wait = time.monotonic() + wait, min(2 * wait, QUEUE_POLL_MAX_S)
        time.sleep(OUTPUT_POLL_S)
    shown.print_new(final=True)
    return last_seen, shown.failure


@dataclasses.dataclass
class _Output:
    """The job's output file, printed line by line as it grows, each line prefixed with the
    job's id; gloo's connection notices are left out, as a local launch leaves them out."""

    job: str
    path: Path
    position: int = 0
    partial: bytes = b""  # the start of a line still being written
    noise: NoiseFilter = dataclasses.field(default_factory=NoiseFilter)
    failure: int | None = None  # the first failing task's exit code, as srun reported it

    def print_new(self, final: bool = False) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self.position)
                data = f.read()
        except FileNotFoundError:  # the job has not started yet
            return
        self.position += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        if final and self.partial:
            lines.append(self.partial)
        for raw in lines:
            line = raw.decode(errors="replace")
            text = _LABEL.sub("", line, count=1)
            if not self.noise.keep(text):
                continue
            failed = _TASK_FAILED.match(line)
            if failed and self.failure is None:
                self.failure = int(failed.group(1))
            print(f"[slurm {self.job}] {line}", flush=True)


def _queue_state(job: str) -> str | None:
    """The job's state while it is in the queue, ``""`` once it has left, None when slurmctld
    did not answer (a busy controller: ask again later)."""
    result = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True,
                            text=True, stdin=subprocess.DEVNULL)
    if result.returncode == 0:
        return result.stdout.strip()
    return "" if "Invalid job id" in result.stderr else None


def _final_state(job: str, last_seen: str | None) -> tuple[str, int]:
    """``(state, exit code)`` of a finished job: from accounting (``sacct``) where the cluster
    keeps it, else from slurmctld, which remembers a finished job for a few minutes."""
    accounted = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job, "-o", "State,ExitCode"],
                               capture_output=True, text=True, stdin=subprocess.DEVNULL)
    found = re.match(r"(\S+)[^|]*\|(\d+):(\d+)", accounted.stdout.strip())
    if accounted.returncode != 0 or found is None:
        shown = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True,
                               text=True, stdin=subprocess.DEVNULL).stdout
        found = re.search(r"\bJobState=(\S+).*?\bExitCode=(\d+):(\d+)", shown)
    if found is None:
        return f"with its end unknown (last seen {last_seen or 'in the queue'})", 1
    state, code, signum = found.group(1), int(found.group(2)), int(found.group(3))
    if state == "COMPLETED":
        return state, code
    return state, 128 + signum if signum else code or 1
