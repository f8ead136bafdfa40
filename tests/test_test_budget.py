"""`nox -s tests` holds each pytest run to its time budget (the repository's conftest.py,
``PAX_TEST_BUDGET``): a file over its budget, or a run over its own, fails the run by name once
every test has run; within budget, nothing changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SLOW = """
import time

def test_sleeps():
    time.sleep(0.4)

def test_passes():
    pass
"""


def _run(tmp_path: Path, file_seconds: float, run_seconds: float, files: str = "",
         shared_seconds: float = 30, source: str = SLOW) -> subprocess.CompletedProcess:
    """pytest on ``source`` under a budget of these numbers (``files``: the TOML lines of the
    files' own budgets)."""
    (tmp_path / "test_slow.py").write_text(source)
    (tmp_path / "budget.toml").write_text(
        f"[tool.pax.test-budget]\nfile_seconds = {file_seconds}\nrun_seconds = {run_seconds}\n"
        f"shared_seconds = {shared_seconds}\n\n[tool.pax.test-budget.files]\n{files}\n")
    # The repository's conftest.py as a plugin of a run outside the repository.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PAX_TEST_BUDGET": str(tmp_path / "budget.toml")}
    env.pop("PAX_TEST_TIMES", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "conftest",
                           "-p", "no:cacheprovider", "test_slow.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_a_file_over_its_budget_fails_the_run_naming_it(tmp_path):
    done = _run(tmp_path, file_seconds=0.2, run_seconds=600)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    assert "test time budget exceeded" in done.stdout
    assert "test_slow.py took 0.4 s, over its budget of 0.2 s" in done.stdout


def test_a_file_within_its_own_budget_and_a_run_over_its_budget(tmp_path):
    done = _run(tmp_path, file_seconds=0.2, run_seconds=0.1, files='"test_slow.py" = 30')
    assert done.returncode == 1, done.stdout + done.stderr
    assert "test_slow.py took" not in done.stdout
    assert "the run took" in done.stdout and "over its budget of 0.1 s" in done.stdout


SHARED = """
import time

import pytest

@pytest.fixture(scope="session")
def built():
    time.sleep(0.5)

@pytest.fixture(scope="module")
def module_built(built):
    time.sleep(0.3)

def test_uses_it(module_built):
    pass
"""


def test_session_fixtures_are_charged_to_the_run_not_to_the_file_that_asked_first(tmp_path):
    done = _run(tmp_path, file_seconds=0.45, run_seconds=600, source=SHARED)
    assert done.returncode == 0, done.stdout + done.stderr  # the file's own 0.3 s
    done = _run(tmp_path, file_seconds=0.2, run_seconds=600, source=SHARED)
    assert "test_slow.py took 0.3 s, over its budget of 0.2 s" in done.stdout, done.stdout
    done = _run(tmp_path, file_seconds=30, run_seconds=600, shared_seconds=0.4, source=SHARED)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the session fixtures took 0.5 s to set up, over their budget of 0.4 s" in done.stdout


def test_within_budget_the_run_passes(tmp_path):
    done = _run(tmp_path, file_seconds=30, run_seconds=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "budget" not in done.stdout


@pytest.mark.parametrize("name", sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())
                                        ["tool"]["pax"]["test-budget"]["files"]))
def test_every_file_with_a_budget_of_its_own_exists(name):
    assert (ROOT / name).is_file(), f"{name} has a budget in pyproject.toml but is not a file"


def test_the_budgets_hold_the_committed_measurement_with_room():
    """``bench/test_times.py --budgets`` gives every long file of the committed measurement
    twice its time or more, and pyproject.toml's budgets hold that measurement."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "test_times.py"), "--budgets"],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    printed = tomllib.loads(done.stdout)
    budget = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pax"]["test-budget"]
    measured = json.loads((ROOT / "bench" / "results" / "test_times.json").read_text())["files"]
    long = {name for name, seconds in measured.items() if 2 * seconds > budget["file_seconds"]}
    assert set(printed) == long
    for name, seconds in measured.items():
        assert printed.get(name, budget["file_seconds"]) >= 2 * seconds, name
        assert budget["files"].get(name, budget["file_seconds"]) >= seconds, name
