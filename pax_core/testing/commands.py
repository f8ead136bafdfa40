"""The ``pax`` command as a test runs it, and what a run wrote."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from pax_core.files import job_path
from pax_core.testing.forked import run_command


def run_pax(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``pax ARGS`` in a process of its own with this process's environment and working
    directory, forked from one that imported Pax once (``pax_core.testing.forked``); a
    traceback fails the test (a user mistake must be one line, and a crash is a bug)."""
    result = run_command(args, env={**os.environ, "PAX_STRICT_PLUGINS": "1"}, timeout=timeout)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def read_metrics(job_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of ``JOB_DIR/metrics.jsonl`` (local or ``gs://``), in order."""
    lines = (job_path(job_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]
