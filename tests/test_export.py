"""``pax export``: the parameters alone, equal to the checkpoint's, in a new directory."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pax_core.testing import read_params, run_pax

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    job = tmp_path_factory.mktemp("export") / "job"
    result = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(job), "--set",
                     "NUM_TRAIN_STEPS=6", "--set", "task.train.save_interval_steps=3")
    assert result.returncode == 0, result.stderr
    return job


@pytest.mark.parametrize("step", [None, 3])
def test_the_exported_parameters_are_the_checkpoints(job, tmp_path, step):
    import orbax.checkpoint as ocp

    out = tmp_path / "served"
    chosen = [] if step is None else ["--restore-checkpoint-step", str(step)]
    result = run_pax("export", "--job-dir", str(job), "--output", str(out), "--json", *chosen)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["step"] == (step or 6) and record["experiment"] == "core/MlpSynthetic"
    assert json.loads((out / "export.json").read_text()) == record
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "export.json", "params"]
    assert (out / "config.json").read_text() == (job / "config.json").read_text()
    params = ocp.StandardCheckpointer().restore(out / "params")
    want = read_params(job, step)
    assert sorted(want) == ["['Dense_0']['bias']", "['Dense_0']['kernel']",
                            "['Dense_1']['bias']", "['Dense_1']['kernel']"]
    for name, value in want.items():
        layer, kind = name[2:-2].split("']['")
        assert np.array_equal(np.asarray(params[layer][kind]), value), name
    assert record["num_params"] == sum(v.size for v in want.values())


def test_an_existing_output_is_never_overwritten(job, tmp_path):
    out = tmp_path / "served"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = run_pax("export", "--job-dir", str(job), "--output", str(out))
    assert result.returncode == 2
    assert f"--output {out} exists and is not empty; choose a new directory" in result.stderr
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_an_output_that_cannot_be_created_is_one_line(job, tmp_path):
    (tmp_path / "file").write_text("not a directory")
    result = run_pax("export", "--job-dir", str(job), "--output", str(tmp_path / "file" / "out"))
    assert result.returncode == 2
    assert f"--output {tmp_path / 'file' / 'out'} cannot be created: " in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_job_without_checkpoints_is_refused(tmp_path):
    result = run_pax("export", "--job-dir", str(tmp_path / "none"), "--output",
                     str(tmp_path / "out"))
    assert result.returncode == 2
    assert "no checkpoint in" in result.stderr and not (tmp_path / "out").exists()


def test_a_partial_output_left_by_another_export_is_never_removed(job, tmp_path):
    out = tmp_path / "served"
    partial = tmp_path / "served.partial"
    partial.mkdir()
    (partial / "keep.txt").write_text("mine")
    result = run_pax("export", "--job-dir", str(job), "--output", str(out))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"pax: error: --output {out}: {partial} exists: another pax export to it is running, or "
        f"one was interrupted; if none is running, remove {partial} and export again (nothing "
        f"was changed)"]
    assert [p.name for p in partial.iterdir()] == ["keep.txt"] and not out.exists()
