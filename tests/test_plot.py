"""`pax plot` draws jobs' metrics from their metrics.jsonl, written here by the JSON-lines
logger itself, and refuses what it cannot draw."""

from __future__ import annotations

import numpy as np
import pytest

from pax_core import UsageError
from pax_core.commands.plot import plot_jobs
from pax_core.loggers.jsonl import JsonlLogger, read_records
from pax_core.testing import run_pax

BLUE, ORANGE = (0x1F, 0x77, 0xB4), (0xFF, 0x7F, 0x0E)  # matplotlib's first two colours


def _job(root, name: str, rate: float, resumed_at: int | None = None) -> str:
    """A job's metrics as a run logs them: loss falling at ``rate``, accuracy evaluated every
    50 steps; ``resumed_at``: a second run that trains the steps after it again."""
    job = str(root / name)
    runs = [(0, 100)] if resumed_at is None else [(0, 100), (resumed_at, 100)]
    for start, end in runs:
        logger = JsonlLogger(job)
        logger.start(experiment="MlpSynthetic", start_step=start, num_train_steps=100,
                     hparams={"eval_metric": "eval/test accuracy"})
        for step in range(start + 10, end + 1, 10):
            logger.write(step, "train", {"loss": 2.0 / (1 + rate * step), "steps_per_sec": 9.0})
            if step % 50 == 0:
                logger.write(step, "eval/test", {"accuracy": rate * step / 100, "loss": 1.0})
        logger.close()
    return job


def _pixels_of(png, colour: tuple[int, int, int]) -> int:
    import matplotlib.image

    rgb = (matplotlib.image.imread(png)[..., :3] * 255).round().astype(int)
    return int(np.all(np.abs(rgb - np.array(colour)) <= 8, axis=-1).sum())


def test_reading_keeps_a_resumed_steps_latest_record(tmp_path):
    job = _job(tmp_path, "resumed", 0.1, resumed_at=60)
    trains = [r["step"] for r in read_records(job) if r["kind"] == "train"]
    assert sorted(trains) == list(range(10, 101, 10)) and len(trains) == 10
    assert [r["kind"] for r in read_records(job)].count("start") == 2


def test_plot_draws_each_job_in_its_colour_with_the_default_metrics(tmp_path):
    first, second = _job(tmp_path, "a", 0.1), _job(tmp_path, "b", 0.02, resumed_at=40)
    output = tmp_path / "runs.png"
    result = run_pax("plot", first, second, "--output", str(output))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"wrote loss, accuracy of 2 job(s) to {output}"
    assert _pixels_of(output, BLUE) > 300 and _pixels_of(output, ORANGE) > 300
    # One job: only the first colour is drawn.
    plot_jobs([first], str(tmp_path / "one.png"), ["eval/test accuracy"])
    assert _pixels_of(tmp_path / "one.png", ORANGE) == 0 < _pixels_of(tmp_path / "one.png", BLUE)


@pytest.mark.parametrize(("args", "message"), [
    (["--output", "{tmp}/x.jpg"], "must end in .png, .svg, .pdf"),
    (["--output", "{tmp}/nowhere/x.png"], "its folder does not exist"),
    (["--output", "{tmp}/x.png", "--metric", "bleu"], "no job logged the metric 'bleu'; "
                                                         "they logged: accuracy, loss, "
                                                         "steps_per_sec"),
])
def test_plot_refuses_what_it_cannot_draw(tmp_path, args, message):
    job = _job(tmp_path, "a", 0.1)
    with pytest.raises(UsageError, match=message.replace(".", r"\.")):
        plot_jobs([job], *[a.format(tmp=tmp_path) for a in args[1:2]],
                  [a for a in args[3:4]])
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob("*.jpg"))


def test_plot_of_a_folder_without_metrics_exits_2(tmp_path):
    (tmp_path / "empty").mkdir()
    result = run_pax("plot", str(tmp_path / "empty"), str(tmp_path / "missing"), "--output",
                     str(tmp_path / "x.png"))
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"pax: error: {tmp_path / 'empty'} has no metrics yet ({tmp_path / 'empty'}/metrics.jsonl "
        f"holds none: a job logs them with the jsonl logger, at its first summary)")
