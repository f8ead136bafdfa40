"""How the repository's test runs are timed and ordered (the tests' own set-up lives in each
package's ``tests/conftest.py``).

* Test files run longest first, by the per-file times last recorded in
  ``bench/results/test_times.json``; a file not recorded yet goes first. xdist hands files to
  its workers in this order (``--no-loadscope-reorder``), so no long file starts last while the
  other worker sits idle. The order of tests inside a file is kept.
* ``PAX_TEST_TIMES=FOLDER`` makes each pytest run write every test's outcome and duration to
  ``FOLDER/SESSION-PID.json`` (SESSION: the nox session running it), which
  ``bench/test_times.py`` turns into the report. (The seqio and ray sessions, whose pytest
  root is their package's folder, reach this file through ``--confcutdir``.)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

RECORDED = Path(__file__).parent / "bench" / "results" / "test_times.json"
TIMES_VAR = "PAX_TEST_TIMES"


def _recorded_file_times() -> dict[str, float]:
    try:
        return json.loads(RECORDED.read_text())["files"]
    except (OSError, ValueError, KeyError):
        return {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    times = _recorded_file_times()
    files = list(dict.fromkeys(item.nodeid.split("::")[0] for item in items))
    rank = {f: (f in times, -times.get(f, 0.0), i) for i, f in enumerate(files)}
    items.sort(key=lambda item: rank[item.nodeid.split("::")[0]])


def pytest_configure(config: pytest.Config) -> None:
    folder = os.environ.get(TIMES_VAR)
    if folder and not hasattr(config, "workerinput"):  # xdist's controller reports for all
        config.pluginmanager.register(_TimeRecorder(Path(folder)), "pax-test-times")


class _TimeRecorder:
    """Each test's phases added up; written once the run ends."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tests: dict[str, dict[str, object]] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        test = self.tests.setdefault(report.nodeid, {"seconds": 0.0, "outcome": "passed"})
        test["seconds"] = round(float(test["seconds"]) + report.duration, 3)
        if report.outcome != "passed" and test["outcome"] == "passed":
            test["outcome"] = report.outcome

    def pytest_sessionfinish(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        session = os.environ.get("NOX_CURRENT_SESSION", "pytest")
        path = self.folder / f"{session}-{os.getpid()}.json"
        path.write_text(json.dumps({"session": session, "tests": self.tests}, indent=0))
