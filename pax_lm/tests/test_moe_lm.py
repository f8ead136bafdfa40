"""Mixture-of-Experts LMs through `pax train`: expert parallelism over 8 fake devices, a
checkpoint that moves between an expert-parallel mesh and a plain data-parallel one, the routing
metrics, the published sizes, and the MoE mistakes a user can make (one line, exit 2, nothing
written)."""

from __future__ import annotations

import importlib
import subprocess
from pathlib import Path

import fiddle as fdl
import pytest
from job_runs import assert_same_run, train_job

from pax_core.testing import read_metrics, read_params, run_pax
from pax_transformer import count_active_params, count_params

EXP = ["--plugin", "lm", "--exp", "TinyMoeLmForTests",
       "--set", "SUMMARY_INTERVAL_STEPS=1", "--set", "CHECKPOINT_EVERY_N_STEPS=2",
       "--set", "EVAL_INTERVAL_STEPS=4"]
DATA_PARALLEL = ["--set", "ICI_MESH_SHAPE=[1,8,1,1]"]
SPARSE_METRICS = ("aux_loss", "load_balancing_loss", "router_z_loss", "dropped_token_fraction",
                  "expert_load_max")


def _train(job_dir: Path, steps: int, *extra: str) -> subprocess.CompletedProcess:
    return train_job(EXP, job_dir, steps, *extra)


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> Path:
    """4 steps with the experts over expert 4 x data 2, not interrupted."""
    job_dir = tmp_path_factory.mktemp("moe") / "job"
    _train(job_dir, 4)
    assert read_metrics(job_dir)[0]["num_devices"] == 8
    return job_dir


def test_an_expert_parallel_run_reports_its_routing(straight):
    records = read_metrics(straight)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval/heldout"]
    assert train and evals
    for record in (train[-1], evals[-1]):
        for name in SPARSE_METRICS:
            assert name in record, (name, sorted(record))
        assert record["dropped_token_fraction"] == 0.0  # dropless
        assert 1.0 <= record["expert_load_max"] <= 4.0  # the busiest expert's share x 4
        assert record["aux_loss"] == pytest.approx(0.01 * record["load_balancing_loss"],
                                                   rel=1e-4)
        # The loss is the cross-entropy plus the auxiliary loss.
        assert record["total_loss"] == pytest.approx(record["avg_xent"] + record["aux_loss"],
                                                     rel=1e-5)


def test_a_checkpoint_moves_from_expert_parallel_to_data_parallel(straight, tmp_path):
    """2 steps over expert 4 x data 2, then 2 more over data 8 (every expert on every device):
    the same run as 4 steps straight."""
    job_dir = tmp_path / "job"
    _train(job_dir, 2)
    resumed = _train(job_dir, 4, *DATA_PARALLEL)
    assert "resuming from step 2" in resumed.stdout
    assert any("['ffn']['router']" in path for path in read_params(straight))
    assert_same_run(job_dir, straight, 4)


@pytest.mark.parametrize("setting,message", [
    ("NUM_EXPERTS_PER_TOKEN=5", "top_k=5 must be between 1 and num_experts=4"),
    ("EXPERT_CAPACITY_FACTOR=0.0", "capacity_factor must be positive"),
    ("NUM_EXPERTS=6", "NUM_EXPERTS=6 does not divide over the 4 devices of the mesh's expert "
                      "axis"),
    ("ICI_MESH_SHAPE=[1,1,8,1]", "NUM_EXPERTS=4 does not divide over the 8 devices"),
], ids=["top-k-over-experts", "capacity-zero", "experts-over-axis", "axis-over-experts"])
def test_a_bad_moe_setting_is_one_line_and_nothing_is_written(tmp_path, setting, message):
    job_dir = tmp_path / "job"
    result = run_pax("train", *EXP, "--job-dir", str(job_dir), "--set", setting, timeout=120)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not job_dir.exists()


def _decoder(name: str):
    module = "quickstart" if "QuickStart" in name else "moe"
    cls = getattr(importlib.import_module(f"pax_lm.experiments.{module}"), name)
    decoder = fdl.build(cls().decoder())
    fields = {k: getattr(decoder, k) for k in decoder.__dataclass_fields__
              if k not in ("parent", "name")}
    return decoder, fields


# Published counts (total, active), to the digits published: GLaM's paper table and NVIDIA's
# Pax README (126M/64E: "~1.9B"); DeepSeekMoE 16B's from its config.json, which its paper
# rounds to 16.4B and 2.8B.
PUBLISHED = {
    "GLaM64B64E": ((1.2e12, 2), (96.6e9, 3)),
    "GLaM126M64E": ((1.9e9, 2), None),
    "DeepSeekMoE16B": ((16_375_728_128, None), (2_828_650_496, None)),
}


def _rounded(value: int, digits: int | None) -> float:
    return float(value) if digits is None else float(f"{value:.{digits}g}")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_the_published_moe_sizes_have_their_published_counts(name):
    decoder, fields = _decoder(name)
    (total, digits), active = PUBLISHED[name]
    assert _rounded(count_params(**fields), digits) == total
    if active is not None:
        assert _rounded(count_active_params(decoder), active[1]) == active[0]


def test_the_moe_quick_start_has_the_dense_quick_starts_weights_a_token():
    moe, moe_fields = _decoder("QuickStartMoeLm")
    _, dense_fields = _decoder("QuickStartLm")
    router = 4 * 192 * 8  # four layers' routers: the only weights a token adds
    assert count_active_params(moe) == count_params(**dense_fields) + router
    assert count_params(**moe_fields) > 2.5 * count_params(**dense_fields)
