"""The ``pax`` command as a test runs it, and what a run wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pax_core.files import job_path


def run_pax(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``pax ARGS`` from this interpreter's environment; a traceback fails the test (a user
    mistake must be one line, and a crash is a bug)."""
    pax = Path(sys.executable).with_name("pax")
    result = subprocess.run([str(pax), *args], capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "PAX_STRICT_PLUGINS": "1"})
    assert "Traceback" not in result.stderr, result.stderr
    return result


def read_metrics(job_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of ``JOB_DIR/metrics.jsonl`` (local or ``gs://``), in order."""
    lines = (job_path(job_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]
