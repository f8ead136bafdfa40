"""`pax train` on a SeqIO task, as a user runs it: the tiny LM learns, its eval counts every
validation sentence once, a resumed run continues, and a wrong task name stops it in one line."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import pytest
import seqio_test_tasks as tasks

from pax_core import restore_latest
from pax_core.testing import isolated_host, read_metrics, run_pax

pytestmark = pytest.mark.slow

TESTS = Path(__file__).parent
EXP = ("--exp", f"{TESTS / 'seqio_experiment.py'}:TinySeqIOLm")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, list[str]]:
    folder = tmp_path_factory.mktemp("seqio_train_corpus")
    lines = tasks.write_corpus(folder)
    tasks.register(folder)  # for this process, which restores a job in place
    with pytest.MonkeyPatch.context() as env:
        # What a user's experiment gets from its module_imports: the task module on the path.
        env.setenv("PAX_SEQIO_TEST_DATA", str(folder))
        env.setenv("PYTHONPATH", str(TESTS))
        yield lines


@pytest.fixture(scope="module")
def trained_job(corpus, tmp_path_factory) -> Path:
    job_dir = tmp_path_factory.mktemp("seqio_job")
    result = run_pax("train", *EXP, "--job-dir", str(job_dir), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return job_dir


def test_pax_train_learns_from_a_seqio_task(trained_job):
    records = read_metrics(trained_job)
    losses = [r["loss"] for r in records if r["kind"] == "train"]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 1.0
    assert losses[-1] < 0.7 * math.log(259)  # well below knowing nothing about bytes


def test_eval_counts_every_validation_sentence_once(corpus, trained_job):
    """8 devices, batch 8: 25 sentences make 4 batches, the last with 7 rows of padding."""
    evals = [r for r in read_metrics(trained_job) if r["kind"] == "eval/validation"]
    # Each sentence's bytes and its eos are predicted once.
    assert evals[-1]["num_predictions"] == sum(len(s.encode()) + 1 for s in corpus["validation"])
    assert evals[-1]["num_batches"] == 4


def test_a_resumed_run_continues_from_its_checkpoint(trained_job):
    """The second run restores the input's position (30 batches) and reads 5 more."""
    result = run_pax("train", *EXP, "--job-dir", str(trained_job), "--set",
                     "NUM_TRAIN_STEPS=35", timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [r["step"] for r in read_metrics(trained_job) if r["kind"] == "train"]
    assert steps[-1] == 35 and steps.count(30) == 1
    host = isolated_host(("seqio", importlib.import_module("pax_seqio.plugin")))
    run, _, step = restore_latest(host, exp=EXP[1], plugin=None, set_items=[],
                                  job_dir=str(trained_job))
    assert step == 35
    state = run.train_input.get_state()
    assert state == {"batches": 35, "rows_per_process": 280, "process_count": 1,
                     "data": run.train_input.data_key()}


def test_an_unknown_task_stops_before_training_in_one_line(corpus, tmp_path):
    job_dir = tmp_path / "job"
    result = run_pax("train", *EXP, "--job-dir", str(job_dir), "--set",
                     "datasets[1].mixture_or_task_name=pax_seqio_test_txt")
    assert result.returncode == 2, result.stderr[-3000:]
    assert ("no SeqIO task or mixture named 'pax_seqio_test_txt'; close registered names: "
            "pax_seqio_test_text") in result.stderr
    assert not (job_dir / "checkpoints").exists()
