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
* ``PAX_TEST_BUDGET=1`` (``nox -s tests`` sets it) holds the run to its time budget,
  ``pyproject.toml``'s ``[tool.pax.test-budget]`` (or another TOML file's, where the variable
  names one): a test file whose tests take longer, summed,
  than its budget (``file_seconds``, or its own under ``files``), or a run longer than
  ``run_seconds``, fails the run, naming each, once every test has run. A new test pays for
  itself by sharing what it trains and compiles, or its file's budget is raised in the same
  change, with the reason beside it. A session fixture is built for whichever file first asks
  for it (which one depends on how xdist hands files out), so its set-up is charged to none of
  them but to the run's shared set-up, whose budget is ``shared_seconds``.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

RECORDED = Path(__file__).parent / "bench" / "results" / "test_times.json"
TIMES_VAR = "PAX_TEST_TIMES"
BUDGET_VAR = "PAX_TEST_BUDGET"
PYPROJECT = Path(__file__).parent / "pyproject.toml"


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


# Seconds this process has spent setting up session fixtures, and the user property that hands
# each test's share of them to xdist's controller.
_shared_setup = [0.0]
SHARED = "pax_shared_setup_seconds"


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef) -> Iterator[None]:
    began = time.perf_counter()  # the fixtures it depends on are set up before this
    yield
    if fixturedef.scope == "session":
        _shared_setup[0] += time.perf_counter() - began


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    before = _shared_setup[0]
    yield
    if _shared_setup[0] > before:
        item.user_properties.append((SHARED, _shared_setup[0] - before))


def _shared_seconds(report: pytest.TestReport) -> float:
    """The session fixtures' set-up inside ``report`` (its test's set-up phase only)."""
    if report.when != "setup":
        return 0.0
    return sum(seconds for name, seconds in report.user_properties if name == SHARED)


def pytest_configure(config: pytest.Config) -> None:
    folder = os.environ.get(TIMES_VAR)
    if hasattr(config, "workerinput"):  # xdist's controller reports for all
        return
    if folder:
        config.pluginmanager.register(_TimeRecorder(Path(folder)), "pax-test-times")
    budget_file = os.environ.get(BUDGET_VAR)
    if budget_file:
        path = PYPROJECT if budget_file == "1" else Path(budget_file)
        budget = tomllib.loads(path.read_text())["tool"]["pax"]["test-budget"]
        config.pluginmanager.register(_TimeBudget(budget), "pax-test-budget")


def over_budget(file_seconds: dict[str, float], run_seconds: float, budget: dict,
                shared_seconds: float = 0.0) -> list[str]:
    """What exceeded ``budget`` (``[tool.pax.test-budget]``), a line each, longest first."""
    allowed = {name: budget.get("files", {}).get(name, budget["file_seconds"])
               for name in file_seconds}
    over = sorted((name for name, seconds in file_seconds.items() if seconds > allowed[name]),
                  key=file_seconds.__getitem__, reverse=True)
    lines = [f"{name} took {file_seconds[name]:.1f} s, over its budget of {allowed[name]} s"
             for name in over]
    if shared_seconds > budget["shared_seconds"]:
        lines.append(f"the session fixtures took {shared_seconds:.1f} s to set up, over their "
                     f"budget of {budget['shared_seconds']} s")
    if run_seconds > budget["run_seconds"]:
        lines.append(f"the run took {run_seconds:.1f} s, over its budget of "
                     f"{budget['run_seconds']} s")
    return lines


class _TimeBudget:
    """Each file's tests added up, and the run's time, against the budget."""

    def __init__(self, budget: dict) -> None:
        self.budget = budget
        self.started = time.monotonic()
        self.files: dict[str, float] = defaultdict(float)
        self.shared = 0.0

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        shared = _shared_seconds(report)
        self.shared += shared
        self.files[report.nodeid.split("::")[0]] += report.duration - shared

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        over = over_budget(self.files, time.monotonic() - self.started, self.budget,
                           self.shared)
        if not over:
            return
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = ["test time budget exceeded (pyproject.toml [tool.pax.test-budget]); make "
                 "these cheaper (shared trained jobs and compiled programs, forked pax "
                 "commands) or raise the budget with its reason:", *(f"  {o}" for o in over)]
        for line in lines:
            if reporter is not None:
                reporter.write_line(line, red=True)
            else:
                print(line)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


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
