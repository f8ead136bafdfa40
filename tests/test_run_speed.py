"""Every `pax train` reports its speed: MFU and HFU with what they were measured against, where
the time went, the first step's time, and a profiler trace of the steps asked for."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest

from pax_core.errors import UsageError
from pax_core.speed.profiling import parse_steps
from pax_core.testing import read_metrics, run_pax

MLP = ["--exp", "MlpSynthetic", "--set", "NUM_TRAIN_STEPS=40"]


@pytest.fixture(scope="module")
def mlp_job(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    job_dir = tmp_path_factory.mktemp("speed") / "job"
    result = run_pax("train", *MLP, "--job-dir", str(job_dir), "--verbose")
    assert result.returncode == 0, result.stderr
    return job_dir, result


def test_start_record_says_what_mfu_is_measured_against(mlp_job):
    job_dir, result = mlp_job
    start = read_metrics(job_dir)[0]
    assert start["kind"] == "start" and start["step"] == 0
    assert start["flops_formula"] == "dense-v1"
    assert start["model_flops_per_step"] == 6 * 64 * (16 * 64 + 64 * 4)
    assert start["hardware_flops_per_step"] > 0
    # 8 fake devices share the host: each gets an eighth of the measured matmul rate.
    assert start["peak_source"].startswith("measured float32 matmul, host shared by 8 device")
    assert start["peak_tflops_per_device"] > 0
    assert "by formula dense-v1" in result.stdout
    assert "TFLOP/s per device (measured float32 matmul" in result.stdout


def test_every_summary_has_utilisation_and_the_time_breakdown(mlp_job):
    job_dir, result = mlp_job
    train = [r for r in read_metrics(job_dir) if r["kind"] == "train"]
    assert [r["step"] for r in train] == [20, 40]
    start = read_metrics(job_dir)[0]
    for record in train:
        per_device = start["model_flops_per_step"] * record["steps_per_sec"] / 8 / 1e12
        assert record["model_tflops_per_device"] == pytest.approx(per_device)
        assert record["mfu"] == pytest.approx(per_device / start["peak_tflops_per_device"])
        ratio = start["hardware_flops_per_step"] / start["model_flops_per_step"]
        assert record["hfu"] == pytest.approx(record["mfu"] * ratio) and record["mfu"] > 0
        times = {k: record[k] for k in ("time_input_ms", "time_step_ms", "time_checkpoint_ms",
                                        "time_eval_ms")}
        assert all(v >= 0 for v in times.values()) and times["time_step_ms"] > 0
        # Steps/s is the inverse of the time per step outside eval.
        outside_eval = sum(times.values()) - times["time_eval_ms"]
        assert 1e3 / record["steps_per_sec"] == pytest.approx(outside_eval, rel=1e-6)
    assert train[0]["first_step_sec"] > 0
    # Launch to the first step's end: the imports, the data and the compile come before it.
    assert train[0]["startup_sec"] > train[0]["first_step_sec"]
    assert "first_step_sec" not in train[1] and "startup_sec" not in train[1]
    # --verbose puts every metric on the step lines: the host's memory among them.
    assert " mfu=" in result.stdout and " time_input_ms=" in result.stdout
    assert all(0.05 < r["host_memory_gib"] < 24 for r in train)


def test_tensorboard_has_the_utilisation_curves_and_their_settings(mlp_job):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train = EventAccumulator(str(mlp_job[0] / "summaries" / "train"))
    train.Reload()
    assert {"perf/mfu", "perf/hfu", "perf/model_tflops_per_device", "perf/host_memory_gib",
            "time/step_ms", "time/input_ms", "time/checkpoint_ms", "time/eval_ms",
            "train/loss"} <= set(train.Tags()["scalars"])
    [settings] = train.Tensors("hparams/text_summary")
    text = settings.tensor_proto.string_val[0].decode()
    assert "| flops_formula | dense-v1 |" in text and "| peak_tflops_per_device |" in text


def test_peak_tflops_overrides_the_device_peak(tmp_path):
    result = run_pax("train", *MLP, "--set", "NUM_TRAIN_STEPS=20", "--peak-tflops", "0.5",
                     "--job-dir", str(tmp_path / "job"))
    assert result.returncode == 0, result.stderr
    start, train = read_metrics(tmp_path / "job")[0], read_metrics(tmp_path / "job")[1]
    assert (start["peak_tflops_per_device"], start["peak_source"]) == (0.5, "--peak-tflops")
    assert train["mfu"] == pytest.approx(train["model_tflops_per_device"] / 0.5)


def _trace_events(job_dir: Path) -> list[dict]:
    traces = list((job_dir / "profile" / "plugins" / "profile").glob("*/perfetto_trace.json.gz"))
    assert len(traces) == 1, traces
    with gzip.open(traces[0]) as f:
        return json.load(f)["traceEvents"]


def test_profile_steps_traces_the_window_with_step_annotations(tmp_path):
    job_dir = tmp_path / "job"
    result = run_pax("train", *MLP, "--set", "NUM_TRAIN_STEPS=8", "--profile-steps", "3:5",
                     "--job-dir", str(job_dir))
    assert result.returncode == 0, result.stderr
    runs = list((job_dir / "profile" / "plugins" / "profile").iterdir())
    assert len(runs) == 1 and list(runs[0].glob("*.xplane.pb"))
    steps = sorted(int(e["args"]["step_num"]) for e in _trace_events(job_dir)
                   if e.get("name") == "train" and "step_num" in e.get("args", {}))
    assert steps == [3, 4, 5]


def test_a_bad_profile_window_is_refused_before_anything_is_written(tmp_path):
    """Through the ``pax`` command; every kind of bad window is the next test's."""
    result = run_pax("train", *MLP, "--profile-steps", "4:2", "--job-dir", str(tmp_path / "job"))
    assert result.returncode == 2
    assert "--profile-steps '4:2': give START:END with 1 <= START <= END" in result.stderr
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize("window", ["5", "0:3", "4:2", "a:b", "3:"])
def test_each_bad_profile_window_is_a_usage_error(window):
    """What ``pax train --profile-steps`` reads its window with (the test above), before it
    starts: a usage error (exit 2) naming the window and the form it takes."""
    with pytest.raises(UsageError) as refused:
        parse_steps(window)
    assert str(refused.value).startswith(
        f"--profile-steps '{window}': give START:END with 1 <= START <= END")
    assert refused.value.exit_code == 2


def test_a_window_outside_the_run_is_reported(tmp_path):
    result = run_pax("train", *MLP, "--set", "NUM_TRAIN_STEPS=4", "--profile-steps", "10:12",
                     "--job-dir", str(tmp_path / "job"))
    assert result.returncode == 0, result.stderr
    assert "--profile-steps 10:12 traces nothing: this run does steps 1 to 4" in result.stderr
    assert not (tmp_path / "job" / "profile").exists()
