"""Fault trials for a plugin's experiment: ``pax train`` killed with SIGKILL at random moments,
rerun each time, then finished; and the final train state read back for comparison.

A plugin checks that its model and input resume exactly (the input's position and the random
keys included) by comparing killed-and-resumed runs with runs left alone, on one device and on
eight::

    kill_and_compare(["--exp", "myplugin/Tiny", "--set", "NUM_TRAIN_STEPS=40", ...], tmp_path,
                     trials=6, steps=40)

``kill_trials``, ``train_losses``, ``read_params`` and ``assert_same_params`` are its parts. Only
a run that SIGKILL killed mid-run counts as a trial; one that ended before its kill is run again
with an earlier kill.
``fault_trials(ci, soak)`` sizes a trial count: an ordinary test run takes a fixed, seeded
sample (``ci``); a soak (``PAX_SOAK=1``, the repository's ``nox -s soak``) runs ``soak``.
``stop_once_saved`` stops a command in the middle of a run, for tests of what resumes it.
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pax_core.files import is_remote, job_path
from pax_core.testing.cpu import cpu_xla_flags
from pax_core.testing.forked import run_command, start_command

SOAK_VAR = "PAX_SOAK"

# A fraction of the kills land while the process starts, compiles or restores (within
# EARLY_WINDOW seconds of its start: a forked run is training within about a second); the rest
# while it trains and saves, within TRAINING_WINDOW seconds after it has logged a new step.
EARLY_KILLS = 0.25
EARLY_WINDOW = 1.5
TRAINING_WINDOW = 0.5


@dataclasses.dataclass
class KillTrials:
    """What ``kill_trials`` saw: how many runs it started and how many SIGKILL killed mid-run
    (the trials asked for: a run still going when the signal came, which died of it); the step
    each run resumed from (a kill never loses a committed step, so they never decrease) and how
    many unfinished saves were removed; the restore messages that named a damaged checkpoint (a
    kill must never damage one), any traceback; the final run; how many runs ended on their own
    before their kill and were run again with an earlier kill."""

    tried: int
    killed: int
    resumed: list[int]
    unfinished_removed: int
    damaged: list[str]
    tracebacks: list[str]
    finished: subprocess.CompletedProcess
    redrawn: int = 0


def _records(metrics: Any) -> int:
    try:
        return metrics.read_bytes().count(b"\n")
    except OSError:
        return 0


def _one_trial(start: Callable[[Path], Any], job_dir: Any, rng: random.Random, log: Path,
               within: float | None = None) -> float | None:
    """Start the run (``start(log)``: a process writing its output to ``log``) and send it
    SIGKILL at a random moment: within ``within`` seconds of its start where given (a redrawn
    trial), else early or a moment after it has logged a training step. Returns None where the
    signal killed it mid-run (it was still going, and died of it), else the seconds it ran
    before it ended on its own, which only a run that trained the job to its end does: a run
    that fails on its own is an error, named with its output."""
    metrics = job_dir / "metrics.jsonl"
    before = _records(metrics)
    started = time.monotonic()
    run = start(log)
    if within is not None:
        deadline = started + rng.uniform(0.0, within)
    elif rng.random() < EARLY_KILLS:
        deadline = started + rng.uniform(0.0, EARLY_WINDOW)
    else:
        deadline = started + 120
        while time.monotonic() < deadline and run.poll() is None:
            if _records(metrics) > before + 1:  # past the start record: training
                break
            time.sleep(0.01)
        deadline = time.monotonic() + rng.uniform(0.0, TRAINING_WINDOW)
    while time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.005)
    sent = run.poll() is None
    if sent:
        run.kill()
    run.wait()
    if sent and run.returncode == -signal.SIGKILL:
        return None
    if run.returncode != 0:
        raise AssertionError(f"run {log.stem} ended with exit status {run.returncode} before "
                             f"its kill; the end of its output ({log}):\n"
                             f"{log.read_text()[-3000:]}")
    return time.monotonic() - started


def fault_trials(ci: int, soak: int) -> int:
    """How many fault trials to run: ``soak`` when ``PAX_SOAK`` is set to 1, else ``ci``. Each
    trial is seconds of a real run, so an ordinary test run samples; the moments stay random
    across the soak's many trials, and the sample's seeds fix which ones CI sees. A kill trial
    counts only where the run was killed mid-run (``kill_trials``)."""
    return soak if os.environ.get(SOAK_VAR, "") == "1" else ci


def kill_trials(args: Sequence[str], job_dir: str | os.PathLike, *, trials: int, seed: int = 0,
                env: Mapping[str, str] | None = None, timeout: float = 600,
                redraws: int | None = None) -> KillTrials:
    """Run ``pax train ARGS --job-dir JOB_DIR`` until SIGKILL has killed ``trials`` runs
    mid-run, each at a random moment (``seed`` fixes them), then once more to the end.

    A run that ends on its own before its kill (it trained the job to its end: the moment came
    too late) is no trial: it is run again with a kill drawn within the time it ran. Up to
    ``redraws`` runs (``1 + trials // 10`` by default) may end so; one more fails with a message
    saying the kill times are too late for the job. ``JOB_DIR`` may be in a bucket (``gs://``);
    the runs' output is then kept in a local temporary folder. The trials share a compilation
    cache of their own beside the output (a kill may cut an entry short, which JAX reports and
    compiles again), so no other run meets what they leave; an ``env`` may name another
    (``PAX_COMPILATION_CACHE``), such as one a run left alone has filled, its entries whole,
    which spares the trials compiling every program. Each run is a process forked from
    one that imported Pax once (``pax_core.testing.forked``): a trial costs the run's own
    seconds, not an interpreter's start."""
    job_dir = job_path(job_dir)
    command = ["train", *args, "--job-dir", str(job_dir)]
    logs = (Path(tempfile.mkdtemp(prefix="pax-trials-")) if is_remote(job_dir)
            else job_dir.parent / f"{job_dir.name}-trials")
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PAX_STRICT_PLUGINS": "1", "PAX_COMPILATION_CACHE": str(logs / "xla"),
           **(env or {})}
    resumed, removed, damaged, tracebacks = [], 0, [], []

    def read(text: str) -> None:
        nonlocal removed
        resumed.extend(int(n) for n in re.findall(r"resuming from step (\d+) of", text))
        removed += text.count("removed the unfinished save")
        damaged.extend(line for line in text.splitlines() if "is damaged" in line)
        if "Traceback" in text:
            tracebacks.append(text)

    def start(log: Path) -> Any:
        return start_command(command, stdout=log, stderr=log, env=env)

    killed, redrawn = _kill_runs(start, job_dir, logs, read, trials=trials, seed=seed,
                                 redraws=1 + trials // 10 if redraws is None else redraws)
    finished = run_command(command, env=env, timeout=timeout)
    read(finished.stdout + finished.stderr)
    return KillTrials(killed + redrawn, killed, resumed, removed, damaged, tracebacks, finished,
                      redrawn)


def _kill_runs(start: Callable[[Path], Any], job_dir: Any, logs: Path,
               read: Callable[[str], None], *, trials: int, seed: int,
               redraws: int) -> tuple[int, int]:
    """Start the run (``start(log)``) again and again until ``trials`` runs were killed
    mid-run, each run's output given to ``read``; a run that ended before its kill is started
    again with a kill within the time it ran, at most ``redraws`` times in all. Returns the
    runs killed and those redrawn."""
    rng = random.Random(seed)
    killed = redrawn = 0
    within = None
    while killed < trials:
        log = logs / f"{killed + redrawn}.err"
        lived = _one_trial(start, job_dir, rng, log, within)
        read(log.read_text())
        if lived is None:
            killed, within = killed + 1, None
            continue
        redrawn += 1
        if redrawn > redraws:
            raise AssertionError(
                f"kill times are too late: runs ended before their kill {redrawn} times, past "
                f"the {redraws} redraws that {trials} trials may take (the last ran "
                f"{lived:.1f} s, to the end of {job_dir}); give the job more steps or draw "
                f"earlier kills")
        within = lived
    return killed, redrawn


def read_params(job_dir: str | os.PathLike, step: int | None = None) -> dict[str, Any]:
    """The parameters of a job's checkpoint (the newest without ``step``; local or ``gs://``;
    saved by any number of processes) as numpy arrays, keyed by their path
    (``['Dense_0']['kernel']``)."""
    import jax
    import numpy as np
    import orbax.checkpoint as ocp

    root = job_path(job_dir) / "checkpoints"
    if step is None:
        step = max(int(p.name) for p in root.iterdir() if p.name.isdigit())
    path = root / str(step) / "state"
    checkpointer = ocp.StandardCheckpointer()
    # Restored onto this process's first device, whatever devices and processes saved it.
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device),
                          checkpointer.metadata(path).item_metadata.tree)
    state = checkpointer.restore(path, target)
    leaves = jax.tree_util.tree_flatten_with_path(state["params"])[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in leaves}


def stop_once_saved(command: Sequence[str], job_dir: str | os.PathLike, signum: int, *,
                    timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``command`` (a ``pax train``, or a ``pax sweep`` with ``job_dir`` one of its trials)
    in a session of its own and send it ``signum`` once ``job_dir`` holds a committed
    checkpoint: the middle of a run, for tests of stopping and resuming. Returns what it
    printed and its exit status; fails if it ends first or nothing is saved in ``timeout``
    seconds."""
    process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    checkpoints = Path(job_dir) / "checkpoints"
    deadline = time.monotonic() + timeout
    while not any(p.name.isdigit() for p in checkpoints.glob("*")):
        if time.monotonic() > deadline or process.poll() is not None:
            process.kill()
            out, err = process.communicate()
            raise AssertionError(f"{command[:2]} saved nothing in {job_dir} before it ended or "
                                 f"{timeout} s passed:\n{out}\n{err}")
        time.sleep(0.2)
    process.send_signal(signum)
    out, err = process.communicate(timeout=timeout)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def train_losses(job_dir: str | os.PathLike) -> dict[int, float]:
    """``{step: loss}`` of a job's train records; a step logged twice is an error (a resume
    must not leave the records of steps it trained again)."""
    import json

    out: dict[int, float] = {}
    for line in (job_path(job_dir) / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "train":
            if record["step"] in out:
                raise AssertionError(f"step {record['step']} is logged twice")
            out[record["step"]] = record["loss"]
    return out


def assert_same_params(got: Mapping[str, Any], want: Mapping[str, Any]) -> None:
    """Bitwise equality of two ``read_params`` results, naming the first that differs."""
    import numpy as np

    assert sorted(got) == sorted(want), (sorted(got), sorted(want))
    for name in sorted(want):
        if not np.array_equal(got[name], want[name]) or got[name].dtype != want[name].dtype:
            diff = np.max(np.abs(got[name].astype(np.float64) - want[name].astype(np.float64)))
            raise AssertionError(f"params{name} differ (largest difference {diff})")


def kill_and_compare(args: Sequence[str], root: str | os.PathLike, *, trials: int,
                     steps: int, devices: Sequence[int] = (1, 8)) -> dict[int, KillTrials]:
    """For each device count (run side by side): ``pax train ARGS`` left alone, then killed
    mid-run ``trials`` times and finished (loading the programs the first compiled); asserts
    that no rerun met a damaged checkpoint or failed with a traceback, that the killed run
    logged each of ``steps`` steps once with the same loss, and that both end with the same
    parameters, bitwise. Returns the trials."""
    import concurrent.futures

    root = Path(root)

    def chain(count: int) -> KillTrials:
        env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": cpu_xla_flags(count),
               "PAX_COMPILATION_CACHE": str(root / f"xla-{count}")}
        straight = kill_trials(args, root / f"straight-{count}", trials=0, env=env)
        assert straight.finished.returncode == 0, straight.finished.stderr
        return kill_trials(args, root / f"killed-{count}", trials=trials, seed=count, env=env)

    with concurrent.futures.ThreadPoolExecutor(len(devices)) as pool:
        results = dict(zip(devices, pool.map(chain, devices), strict=True))
    # What every device count tried, for a failure's message: a soak that fails still reports
    # its counts.
    seen = "; ".join(f"{count} device(s): {k.killed} runs killed mid-run, {k.redrawn} redrawn, "
                     f"{len(k.damaged)} met a damaged checkpoint" for count, k in results.items())
    for count, killed in results.items():
        assert killed.finished.returncode == 0, (f"{seen}\n{count} device(s), the final run:\n"
                                                 f"{killed.finished.stderr}")
        assert killed.tracebacks == [], f"{seen}\n{count} device(s):\n{killed.tracebacks[0]}"
        assert killed.damaged == [], f"{seen}\n{count} device(s):\n" + "\n".join(killed.damaged)
        assert killed.resumed == sorted(killed.resumed), killed.resumed  # nothing committed lost
        killed_dir, straight_dir = root / f"killed-{count}", root / f"straight-{count}"
        losses = train_losses(killed_dir)
        assert sorted(losses) == list(range(1, steps + 1)), count
        assert losses == train_losses(straight_dir), count
        assert_same_params(read_params(killed_dir), read_params(straight_dir))
    return results
