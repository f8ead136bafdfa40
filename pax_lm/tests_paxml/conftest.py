"""Tests against paxml itself (the ``paxml`` nox session): paxml 1.4 trains the tiny
experiments of ``praxis_side/`` in its own Python 3.10 environment (``PAXML_PYTHON``, which
the session makes), once for the whole run; the tests import what it wrote. Every test sees 8
fake CPU devices, set before anything imports JAX."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pax_core.testing import use_cpu_devices

use_cpu_devices(8)

DRIVER = Path(__file__).parent / "praxis_side" / "train_and_reference.py"


@pytest.fixture(scope="session")
def paxml_runs(tmp_path_factory) -> Path:
    """The folder of paxml jobs, one a variant, each with praxis's logits (``reference.npz``)."""
    python = os.environ.get("PAXML_PYTHON")
    if not python:
        pytest.fail("PAXML_PYTHON is not set: these tests run in `nox -s paxml`, which makes "
                    "paxml 1.4's Python 3.10 environment")
    out = tmp_path_factory.mktemp("paxml") / "runs"
    result = subprocess.run([python, str(DRIVER), str(out)], capture_output=True, text=True)
    sys.stdout.write(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    return out
