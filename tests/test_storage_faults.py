"""Storage that fails under a run: a disk that fills, a checkpoint directory that turns
read-only or is removed. The run stops within seconds with one line naming the step, the cause
and the newest complete checkpoint, which is intact: the same command resumes from it.

Each case runs ``pax train`` in a private mount namespace (``unshare``) on a small tmpfs, so
the disk really fills and the mount really turns read-only, without touching the machine's.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pax_core.testing import run_pax

pytestmark = pytest.mark.slow

TRAIN = "--exp MlpSynthetic --set task.train.save_interval_steps=5"


def _unshare() -> list[str] | None:
    """The ``unshare`` command line that gives this user a private mount namespace."""
    if shutil.which("unshare") is None:
        return None
    for command in (["unshare", "--mount", "--propagation", "private"],
                    ["unshare", "--user", "--map-root-user", "--mount", "--propagation",
                     "private"]):
        probe = subprocess.run([*command, "sh", "-c", "mount -t tmpfs tmpfs /mnt"],
                               capture_output=True)
        if probe.returncode == 0:
            return command
    return None


UNSHARE = _unshare()
needs_mounts = pytest.mark.skipif(UNSHARE is None, reason="no private mount namespace here")
# A run that goes on this long after its storage failed is stopped: the test fails on its
# time, not on the whole case's timeout.
STOP_SEC = 120


def _retried(command: str) -> str:
    """``command`` tried again until it succeeds (at most 100 times): a save in flight makes a
    remount read-only fail as busy."""
    return f"for _ in $(seq 100); do {command} 2>/dev/null && break; sleep 0.05; done"


# While the run trains: make its storage fail, then time how long it takes to end.
FAULTS = {
    "the disk fills": "dd if=/dev/zero of=$DISK/filler bs=1M count=64 2>/dev/null",
    "the checkpoints turn read-only": "mount --bind $JOB/checkpoints $JOB/checkpoints && "
                                      + _retried("mount -o remount,ro,bind $JOB/checkpoints"),
    # At once (moved away, then deleted): an ``rm -rf`` that a save in flight makes retry would
    # go on removing steps after the run has told which one is intact.
    "the checkpoints are removed": "mv $JOB/checkpoints $DISK/gone; rm -rf $DISK/gone",
}


def _in_namespace(tmp_path: Path, body: str) -> None:
    script = tmp_path / "case.sh"
    script.write_text(textwrap.dedent(f"""\
        set -u
        DISK={tmp_path}/disk JOB={tmp_path}/disk/job OUT={tmp_path}
        PAX="{Path(sys.executable).with_name("pax")}"
        mount -t tmpfs -o size=24m tmpfs $DISK
        """) + textwrap.dedent(body))
    (tmp_path / "disk").mkdir()
    subprocess.run([*UNSHARE, "bash", str(script)], check=True, timeout=300)


def _one_error_line(err: str) -> str:
    assert "Traceback" not in err and "ERROR:absl" not in err, err
    errors = [line for line in err.splitlines() if line.startswith("pax: error: ")]
    others = [line for line in err.splitlines() if not line.startswith("pax: ")]
    assert len(errors) == 1 and not others, err
    # Echoes of the failure (a clean-up, a library's thread) are for the log file, not the
    # lines above the cause.
    assert "a clean-up" not in err and "background thread" not in err, err
    return errors[0]


def _fail_under_a_run(tmp_path: Path, settings: str, at_step: int, fault: str
                      ) -> tuple[int, float, str]:
    """Train (``TRAIN`` and ``settings``) until step ``at_step`` is logged, run ``fault``, and
    time how long the run takes to end (it is killed after ``STOP_SEC``); then run the same
    command to five steps past its newest checkpoint folder (``OUT/resumed.*``; ``OUT/intact``
    is the newest step with its checksum record before that). Returns the status, the seconds
    and the one error line."""
    _in_namespace(tmp_path, f"""\
        PAX_STRICT_PLUGINS=1 $PAX train {TRAIN} {settings} --set NUM_TRAIN_STEPS=1000000 \\
            --job-dir $JOB > $OUT/out 2> $OUT/err & RUN=$!
        until grep -qs '"step": {at_step}, "kind": "train"' $JOB/metrics.jsonl; do
          kill -0 $RUN 2>/dev/null || break; sleep 0.1
        done
        {fault}
        START=$(date +%s.%N)
        ( sleep {STOP_SEC}; kill -9 $RUN 2>/dev/null ) & WATCH=$!
        wait $RUN; echo $? > $OUT/status; kill $WATCH 2>/dev/null
        echo "$(date +%s.%N) - $START" | bc > $OUT/seconds
        rm -f $DISK/filler; umount $JOB/checkpoints 2>/dev/null
        LAST=$(ls $JOB/checkpoints 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -1)
        ls $JOB/checkpoints/*/pax_checksums.json 2>/dev/null | xargs -r -n1 dirname \
            | xargs -r -n1 basename | grep -E '^[0-9]+$' | sort -n | tail -1 > $OUT/intact
        $PAX train {TRAIN} --set NUM_TRAIN_STEPS=$(( ${{LAST:-0}} + 5 )) --job-dir $JOB \\
            > $OUT/resumed.out 2> $OUT/resumed.err; echo $? > $OUT/resumed.status
        """)
    return (int((tmp_path / "status").read_text()), float((tmp_path / "seconds").read_text()),
            _one_error_line((tmp_path / "err").read_text()))


@needs_mounts
@pytest.mark.serial  # it times how soon the run stops, which a loaded machine delays
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_storage_failure_during_a_run_stops_it_with_one_line(tmp_path, fault):
    status, seconds, error = _fail_under_a_run(tmp_path, "", 20, FAULTS[fault])
    assert status == 1, error
    assert seconds < 30, seconds
    cause = {"the disk fills": "No space left on device",
             "the checkpoints turn read-only": "Read-only file system",
             "the checkpoints are removed": "No such file or directory"}[fault]
    assert re.match(rf"pax: error: (the checksums of )?checkpoint step \d+ could not be written "
                    rf"to \S+ \({cause}\); ", error), error
    assert "then run the same command to resume" in error
    if _resumes_as_the_error_says(tmp_path, error) is None:  # removed, no save came after
        assert fault == "the checkpoints are removed"


def _resumes_as_the_error_says(tmp_path: Path, error: str) -> int | None:
    """The run of the same command resumed from the step the error line called intact, or,
    where it named none (the metrics failed first), from the newest complete checkpoint: the
    newest with its checksum record (None: none is left, and the run started afresh); returns
    that step."""
    assert int((tmp_path / "resumed.status").read_text()) == 0, (
        f"{error}\nthe resume: {(tmp_path / 'resumed.err').read_text()[-1500:]}")
    resumed = (tmp_path / "resumed.out").read_text()
    kept = re.search(r"the newest complete checkpoint, step (\d+), is intact|"
                     r"step (\d+) itself is complete \(what failed came after it\)", error)
    recorded = (tmp_path / "intact").read_text().strip()
    intact = int(kept[1] or kept[2]) if kept else int(recorded) if recorded else None
    if intact is None or "no complete checkpoint is left" in error:
        assert intact is None and "resuming" not in resumed, resumed
        return None
    assert f"resuming from step {intact} of" in resumed, resumed
    # A step the failure left without its checksum record, newer than the intact one, may be
    # set aside as one that cannot be verified; none is damaged.
    assert "is damaged" not in (tmp_path / "resumed.err").read_text()
    return intact


# Between saves, with a summary every step: the metrics (metrics.jsonl, TensorBoard's events)
# meet the failure first. TensorBoard's writer thread once died on it and the run hung.
BETWEEN_SAVES = {
    "the disk fills": ("dd if=/dev/zero of=$DISK/filler bs=1M count=64 2>/dev/null",
                       "No space left on device"),
    "the job directory is removed": ("mv $JOB $DISK/gone; rm -rf $DISK/gone",
                                     "No such file or directory"),
}


@needs_mounts
@pytest.mark.serial  # it times how soon the run stops, which a loaded machine delays
@pytest.mark.parametrize("fault", sorted(BETWEEN_SAVES))
def test_a_storage_failure_between_saves_stops_the_run_with_one_line(tmp_path, fault):
    command, cause = BETWEEN_SAVES[fault]
    settings = "--set task.train.save_interval_steps=20 --set task.train.summary_interval_steps=1"
    status, seconds, error = _fail_under_a_run(tmp_path, settings, 30, command)
    assert status == 1, error
    assert seconds < 30, seconds
    assert f"({cause})" in error and "run the same command" in error, error
    # The newest folder may be a step whose checksum record the failure stopped: the error
    # names the step before it, and the resume takes that one.
    _resumes_as_the_error_says(tmp_path, error)


@needs_mounts
def test_a_full_disk_at_the_start_is_one_line(tmp_path):
    _in_namespace(tmp_path, f"""\
        mkdir $JOB
        dd if=/dev/zero of=$DISK/filler bs=1M count=64 2>/dev/null
        $PAX train {TRAIN} --set NUM_TRAIN_STEPS=10 --job-dir $JOB 2> $OUT/err
        echo $? > $OUT/status
        """)
    error = _one_error_line((tmp_path / "err").read_text())
    assert (tmp_path / "err").read_text().splitlines()[0] == error  # the cause comes first
    assert int((tmp_path / "status").read_text()) == 1
    assert error.startswith(f"pax: error: cannot write to --job-dir {tmp_path}/disk/job (No "
                            f"space left on device): free space there, then run the same command")


@needs_mounts
def test_read_only_checkpoints_are_refused_before_a_resume(tmp_path):
    job = tmp_path / "job"
    first = run_pax("train", *TRAIN.split(), "--set", "NUM_TRAIN_STEPS=10", "--job-dir", str(job))
    assert first.returncode == 0, first.stderr
    runs = (job / "runs.jsonl").read_text()
    _in_namespace(tmp_path, f"""\
        mount --bind {job}/checkpoints {job}/checkpoints
        mount -o remount,ro,bind {job}/checkpoints
        $PAX train {TRAIN} --set NUM_TRAIN_STEPS=20 --job-dir {job} 2> $OUT/err
        echo $? > $OUT/status
        """)
    error = _one_error_line((tmp_path / "err").read_text())
    assert int((tmp_path / "status").read_text()) == 2
    assert error == (f"pax: error: {job}/checkpoints is not writable; make it writable (or use "
                     f"another --job-dir), then run the same command (nothing was changed)")
    assert (job / "runs.jsonl").read_text() == runs
