"""The job directory stays whole: one run at a time, records replaced atomically, a damaged
record named, metrics without the steps a resume trains again, changed settings noticed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pax_core.errors import UsageError
from pax_core.run.jobdir import JobDir
from pax_core.testing import evaluate, isolated_host, read_metrics, run_pax, train

MLP = ["--exp", "MlpSynthetic"]
SETS = ["--set", "task.train.save_interval_steps=2", "--set",
        "task.train.summary_interval_steps=1"]
EVERY_STEP = ["task.train.save_interval_steps=2", "task.train.summary_interval_steps=1"]


def _train(job: Path, *items: str) -> None:
    train(isolated_host(), exp="MlpSynthetic", plugin=None, set_items=list(items),
          job_dir=str(job))


@pytest.fixture
def job(tmp_path) -> Path:
    job = tmp_path / "job"
    _train(job, "NUM_TRAIN_STEPS=4", *EVERY_STEP)
    return job


def test_a_second_train_in_a_held_job_dir_is_refused_naming_the_first(job):
    before = sorted(p.name for p in (job / "checkpoints").iterdir())
    with JobDir(job).lock():
        second = run_pax("train", *MLP, "--job-dir", str(job), "--set", "NUM_TRAIN_STEPS=8")
    assert second.returncode == 2, second.stderr
    assert f"is in use by another pax train (pid {os.getpid()} on " in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1, second.stderr
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == before


def test_the_lock_of_a_killed_run_is_released(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pax_core.run.jobdir import JobDir
        with JobDir({str(tmp_path)!r}).lock():
            print("held", flush=True)
            time.sleep(600)
        """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(UsageError, match="in use by another pax train"), JobDir(tmp_path).lock():
        pass
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    with JobDir(tmp_path).lock():
        pass


def test_a_job_of_checkpoints_without_its_record_is_refused_unless_they_never_completed(
        tmp_path):
    """A directory whose record was lost (removed under a run) keeps its steps from a run of
    another experiment; a save that never completed is no step and does not hold it."""
    steps = tmp_path / "job" / "checkpoints"
    (steps / f"40.orbax-checkpoint-tmp-{os.getpid()}").mkdir(parents=True)
    JobDir(tmp_path / "job").check_same_experiment("MlpSynthetic")
    (steps / "20").mkdir()
    with pytest.raises(UsageError, match=r"has checkpoints but no runs\.jsonl"):
        JobDir(tmp_path / "job").check_same_experiment("MlpSynthetic")


def test_a_job_whose_record_was_removed_resumes_from_its_checkpoints(job, capfd):
    (job / "runs.jsonl").unlink()
    _train(job, "NUM_TRAIN_STEPS=6", *EVERY_STEP)
    out, err = capfd.readouterr()
    assert "has checkpoints but no runs.jsonl (its record was removed)" in err
    assert "resuming from step 4 of" in out, out
    assert [run["overrides"] for run in JobDir(job).runs()] == [["NUM_TRAIN_STEPS=6",
                                                                 *EVERY_STEP]]


DAMAGES = {
    "garbage": (lambda text: "\x00\x17garbage\n" + text, "line 1 is not JSON"),
    "truncated last line": (lambda text: text + text[: len(text) // 2], "line 2 is not JSON"),
    "missing key": (lambda text: text + json.dumps({"time": "x", "overrides": []}) + "\n",
                    "line 2 has no 'experiment'"),
}


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_damaged_runs_record_is_named_and_nothing_changes(job, command):
    """Through the ``pax`` command: one line, exit 2; each kind of damage is the next test's."""
    change, message = DAMAGES["garbage"]
    runs = job / "runs.jsonl"
    runs.write_text(change(runs.read_text()))
    damaged = runs.read_text()
    args = [*MLP, "--set", "NUM_TRAIN_STEPS=8"] if command == "train" else []
    result = run_pax(command, *args, "--job-dir", str(job))
    assert result.returncode == 2, result.stderr
    assert f"pax: error: {runs} is damaged: {message}; " in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert runs.read_text() == damaged
    assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["2", "4"]


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_each_damage_of_the_runs_record_is_named_and_nothing_changes(job, damage, capfd):
    """``pax train`` and ``pax eval`` in this process: the usage error (exit 2) that the command
    prints as the one line of the test above (and nothing else said), naming the line and what
    is wrong with it."""
    change, message = DAMAGES[damage]
    runs = job / "runs.jsonl"
    runs.write_text(change(runs.read_text()))
    damaged = runs.read_text()
    capfd.readouterr()  # what training the job printed
    for command, items in ((train, ["NUM_TRAIN_STEPS=8"]), (evaluate, [])):
        with pytest.raises(UsageError) as refused:
            command(isolated_host(), exp="MlpSynthetic" if items else None, plugin=None,
                    set_items=items, job_dir=str(job))
        assert str(refused.value).startswith(f"{runs} is damaged: {message}; "), command
        assert "\n" not in str(refused.value) and refused.value.exit_code == 2
        assert capfd.readouterr().err == ""
        assert runs.read_text() == damaged
        assert sorted(p.name for p in (job / "checkpoints").iterdir()) == ["2", "4"]


def test_a_record_that_cannot_be_replaced_leaves_the_old_one(job, monkeypatch):
    runs = job / "runs.jsonl"
    before = runs.read_text()
    replace = os.replace

    def fail_on_runs(source, target):
        if Path(target).name == "runs.jsonl":
            raise OSError(28, "No space left on device")
        replace(source, target)

    monkeypatch.setattr(os, "replace", fail_on_runs)
    with pytest.raises(OSError):
        JobDir(job).record(experiment="core/MlpSynthetic", overrides=[], config_json="{}",
                           config_text="", plugins={})
    assert runs.read_text() == before
    assert not (job / "runs.jsonl.tmp").exists()


def test_metrics_keep_one_record_per_step_after_a_resume(job):
    # As if the run had been killed after logging steps 3 and 4 but before saving step 4, in
    # the middle of writing a line.
    shutil.rmtree(job / "checkpoints" / "4")
    with open(job / "metrics.jsonl", "a") as f:
        f.write('{"step": 5, "kind": "tr')
    _train(job, "NUM_TRAIN_STEPS=6", *EVERY_STEP)
    records = read_metrics(job)
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == sorted(set(steps)) == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in records if r["kind"] == "start"] == [0, 2]


def test_tensorboard_hides_the_steps_a_resume_trains_again(job):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    shutil.rmtree(job / "checkpoints" / "4")
    _train(job, "NUM_TRAIN_STEPS=6", *EVERY_STEP)
    events = EventAccumulator(str(job / "summaries" / "train"))
    events.Reload()
    steps = [e.step for e in events.Scalars("train/loss")]
    assert steps == [1, 2, 3, 4, 5, 6]


def test_a_resume_with_changed_settings_says_which(job):
    result = run_pax("train", *MLP, "--job-dir", str(job), "--set", "NUM_TRAIN_STEPS=6",
                     "--set", "LEARNING_RATE=0.5", *SETS)
    assert result.returncode == 0, result.stderr
    notice = [line for line in result.stderr.splitlines() if "settings changed" in line]
    assert len(notice) == 1, result.stderr
    assert notice[0].startswith("pax: warning: resuming from step 4 with settings changed")
    assert "task.train.num_train_steps: 4 -> 6" in notice[0]
    assert "learning_rate: " in notice[0] and " -> 0.5" in notice[0]
    again = run_pax("train", *MLP, "--job-dir", str(job), "--set", "NUM_TRAIN_STEPS=6",
                    "--set", "LEARNING_RATE=0.5", *SETS)
    assert "settings changed" not in again.stderr


def _snapshot(job: Path, leave_out: tuple[str, ...] = ()) -> dict[str, tuple[int, bytes]]:
    """Every file of the job: its modification time and bytes."""
    return {str(p.relative_to(job)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(job.rglob("*")) if p.is_file() and p.name not in leave_out}


def test_a_rerun_of_a_finished_job_trains_nothing_and_records_nothing(job):
    before = _snapshot(job, leave_out=("train.lock",))
    result = run_pax("train", *MLP, "--job-dir", str(job), "--set", "NUM_TRAIN_STEPS=4", *SETS)
    assert result.returncode == 0, result.stderr
    assert "trained to step 4 in an earlier run; nothing to train" in result.stdout
    assert _snapshot(job, leave_out=("train.lock",)) == before  # no second final eval record


def test_a_resume_refused_for_a_config_that_does_not_fit_changes_no_file(job):
    before = _snapshot(job)
    result = run_pax("train", *MLP, "--job-dir", str(job), "--set", "NUM_TRAIN_STEPS=6",
                     "--set", "HIDDEN_DIMS=(32,)", *SETS)
    assert result.returncode == 2, result.stderr
    assert "does not fit this config" in result.stderr
    assert _snapshot(job) == before  # the lock file included
