"""Helpers of the tests that train a job through `pax train` and compare two jobs' runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from pax_core.testing import read_params, run_pax, train_losses


def train_job(args: list[str], job_dir: Path, steps: int, *extra: str
              ) -> subprocess.CompletedProcess:
    """`pax train ARGS --job-dir JOB_DIR` to step ``steps``, which must succeed."""
    result = run_pax("train", *args, "--job-dir", str(job_dir), "--set",
                     f"NUM_TRAIN_STEPS={steps}", *extra, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def assert_same_run(job_dir: Path, expected: Path, steps: int) -> None:
    """The two jobs logged the same losses for steps 1 .. ``steps`` and hold the same weights."""
    got, want = train_losses(job_dir), train_losses(expected)
    assert sorted(got) == sorted(want) == list(range(1, steps + 1))
    np.testing.assert_allclose([got[s] for s in sorted(got)], [want[s] for s in sorted(want)],
                               rtol=1e-5)
    params, reference = read_params(job_dir), read_params(expected)
    for path, value in reference.items():
        np.testing.assert_allclose(params[path], value, rtol=1e-5, atol=1e-6, err_msg=path)
