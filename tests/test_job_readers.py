"""The commands that read a job (``pax eval``, ``pax export``; a modality's ``pax decode`` uses
the same path) never touch its files: they may run while ``pax train`` is still writing it, and
a reader that tidied up the save in progress would kill the run."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pax_core.testing import run_pax

pytestmark = pytest.mark.slow


def _listing(job: Path) -> dict[str, int]:
    """Every file under the job with its size: what a reader must leave as it was."""
    return {str(p.relative_to(job)): p.stat().st_size for p in job.rglob("*") if p.is_file()}


def test_eval_and_export_of_a_job_in_training_leave_the_run_alone(tmp_path):
    job, pax = tmp_path / "job", Path(sys.executable).with_name("pax")
    # A save every step: a save is in progress (an unfinished folder) nearly all the time.
    train = subprocess.Popen(
        [str(pax), "train", "--exp", "MlpSynthetic", "--job-dir", str(job), "--set",
         "NUM_TRAIN_STEPS=1000000", "--set", "task.train.save_interval_steps=1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not any(p.name.isdigit() for p in (job / "checkpoints").glob("*")):
            assert train.poll() is None and time.monotonic() < deadline, train.communicate()
            time.sleep(0.2)
        evaluated = run_pax("eval", "--job-dir", str(job), "--json", timeout=240)
        exported = run_pax("export", "--job-dir", str(job), "--output",
                           str(tmp_path / "exported"), timeout=240)
        assert train.poll() is None, train.communicate()  # the readers ran while it trained
    finally:
        train.send_signal(signal.SIGTERM)
        _, err = train.communicate(timeout=240)
    assert evaluated.returncode == 0, evaluated.stderr
    assert "absl" not in evaluated.stderr, evaluated.stderr  # Orbax's read-only notes are not news
    assert "test" in json.loads(evaluated.stdout)["eval"]
    assert exported.returncode == 0, exported.stderr
    assert train.returncode == 128 + signal.SIGTERM, err
    assert "stopped on request (SIGTERM)" in err


@pytest.fixture(scope="module")
def small_job(tmp_path_factory) -> Path:
    """A job trained 20 steps with checkpoints at 10 and 20, trained once for the tests below;
    each works on a copy of its own."""
    job = tmp_path_factory.mktemp("small") / "job"
    trained = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(job), "--set",
                      "NUM_TRAIN_STEPS=20", "--set", "task.train.save_interval_steps=10")
    assert trained.returncode == 0, trained.stderr
    return job


def test_a_reader_passes_over_a_damaged_step_and_an_unfinished_save_moving_nothing(
        small_job, tmp_path):
    job = tmp_path / "job"
    shutil.copytree(small_job, job)
    unfinished = job / "checkpoints" / "30.orbax-checkpoint-tmp-1"
    unfinished.mkdir()
    (unfinished / "partial").write_text("being written")
    (job / "checkpoints" / "20" / "input" / "metadata").write_text('{"index": 3}')
    before = _listing(job)
    result = run_pax("eval", "--job-dir", str(job), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["step"] == 10
    assert "passing over checkpoint step 20" in result.stderr and "left in place" in result.stderr
    assert _listing(job) == before


def _edit_last_run(job: Path, **changes) -> None:
    lines = (job / "runs.jsonl").read_text().splitlines()
    lines[-1] = json.dumps({**json.loads(lines[-1]), **changes})
    (job / "runs.jsonl").write_text("\n".join(lines) + "\n")


def test_a_job_naming_a_file_of_code_as_its_experiment_is_not_imported(small_job, tmp_path):
    job = tmp_path / "job"
    shutil.copytree(small_job, job)
    marker = tmp_path / "ran"
    code = tmp_path / "sent.py"
    code.write_text(f"open({str(marker)!r}, 'w').close()\n"
                    "from pax_core.examples import MlpSynthetic\n"
                    "class Exp(MlpSynthetic):\n    pass\n")
    _edit_last_run(job, experiment=f"{code}:Exp")
    for command in (["eval"], ["export", "--output", str(tmp_path / "out")]):
        result = run_pax(*command, "--job-dir", str(job))
        assert result.returncode == 2, result.stderr
        assert result.stderr.count("\n") == 1 and f"{code}:Exp" in result.stderr
        assert "pass --exp" in result.stderr
        assert not marker.exists()
    trusted = run_pax("eval", "--job-dir", str(job), "--exp", f"{code}:Exp")
    assert trusted.returncode == 0, trusted.stderr  # named by the user: trusted
    assert marker.exists()


def test_a_config_naming_other_code_is_refused_before_fiddle_imports_it(small_job, tmp_path):
    job = tmp_path / "job"
    shutil.copytree(small_job, job)
    config = json.loads((job / "config.json").read_text())
    model = next(o for o in config["objects"].values()
                 if "pax_core.models" in json.dumps(o.get("items", "")))
    model["items"][0][1] = {"type": "pyref", "module": "os", "name": "system"}
    (job / "config.json").write_text(json.dumps(config))
    _edit_last_run(job, config_file=str(job / "config.json"))
    result = run_pax("eval", "--job-dir", str(job))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "names os.system" in result.stderr


def test_a_step_removed_while_it_is_read_is_listed_again_not_called_damaged(small_job, tmp_path):
    """A training job removes its old steps (``max_to_keep``) one item after another; a reader
    that meets a step with an item gone waits to see whether the step goes, and lists the steps
    again (``StepRemoved``) instead of calling it damaged. A step that stays is damaged."""
    import jax

    from pax_core.checkpointers.base import StepRemoved
    from pax_core.checkpointers.integrity import DamagedCheckpoint
    from pax_core.testing import PluginHost, build_run, resolve

    host = PluginHost()
    run = build_run(host, resolve(host, "MlpSynthetic", None, ["NUM_TRAIN_STEPS=5"]),
                    jax.devices()[:1])
    for removed in (True, False):
        job = tmp_path / f"job-{removed}"
        shutil.copytree(small_job, job)
        step = job / "checkpoints" / "20"
        shutil.rmtree(step / "input")  # the first item a removal took
        reader = run.make_checkpointer(str(job / "checkpoints"), read_only=True)
        remover = threading.Timer(0.5, shutil.rmtree, [step])
        if removed:
            remover.start()
        try:
            with pytest.raises(StepRemoved if removed else DamagedCheckpoint):
                reader.restore(20, run.abstract_state)
        finally:
            remover.cancel()
            reader.close()
        assert step.exists() != removed
