"""CI's time, session by session and test by test: a clean clone of this checkout's HEAD runs
``.ci/run`` (as CI does, ``CI=true``, with an empty uv cache so the installation is timed as on
a new machine), with ``PAX_TEST_TIMES`` set so that .ci/run keeps each session's time and every
pytest run each test's (the repository's ``conftest.py``).

Writes ``bench/results/test_times.json`` (the numbers; its per-file times also order the next
test runs, longest file first) and ``test_times.md`` (the report), comparing with
``test_times_before.json``: the measurement before the test suite was made faster, and the test
ids it had. Every id that no longer exists must name the test that now covers it
(``COVERED_BY``); the report flags any that does not.

    python3 bench/test_times.py [--runs 2]        # or: python3 -m nox -s test_times

``--budgets`` prints the per-file budgets the last measurement gives, for ``pyproject.toml``'s
``[tool.pax.test-budget.files]``: twice a file's time, or its time and a minute where that is
more (a shared machine's noise reaches one and a half times a file's time), for each file
whose time is over half the default ``file_seconds``.

``--read FOLDER`` records a run whose folder a failed measurement kept (its failed tests
marked so). ``--from-junit FOLDER --ids FILE`` instead records a measurement made by hand
(``nox -s S -- --junitxml=FOLDER/junit-S.xml`` per session, ``FOLDER/times.txt`` with lines
``S rc=N SECs``, and ``FILE`` from ``pytest --collect-only -q``), as
``test_times_before.json`` was.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import report

ROOT = Path(__file__).resolve().parent.parent
BEFORE = report.FOLDER / "test_times_before.json"
TOP = 25

# Test ids of the measurement before that no longer exist, and the test that covers each now.
_API = "tests/test_plugin_api.py::test_plugins_import_only_the_public_api"
_SOURCES = {"pax_lm/src": "pax_lm/src/pax_lm", "pax_vision/src": "pax_vision/src/pax_vision",
            "pax_speech/src": "pax_speech/src/pax_speech",
            "tests/plugins/pax_testplugin/src": "tests/plugins/pax_testplugin/src/pax_testplugin",
            **{f"plugins/{p}/src": f"plugins/{p}/src/{p}" for p in (
                "pax_gpu", "pax_multislice", "pax_pipeline", "pax_ray", "pax_seqio",
                "pax_transformer")}}
_NO_MODEL = ("plugins/pax_transformer/tests/test_transformer_plugin.py::"
             "test_the_plugin_is_active_and_registers_no_model")
COVERED_BY: dict[str, str] = {
    # A layer is not a model: pax-transformer and pax-pipeline no longer register theirs.
    "plugins/pax_transformer/tests/test_transformer_plugin.py::"
    "test_plugin_registers_transformer_lm": _NO_MODEL,
    "plugins/pax_transformer/tests/test_transformer_conformance.py::TestConformance::"
    "test_registration_imports_and_builds[models/transformer_lm]": _NO_MODEL,
    "plugins/pax_pipeline/tests/test_pipeline_conformance.py::TestConformance::"
    "test_registration_imports_and_builds[models/pipelined_transformer_stack]":
        "plugins/pax_pipeline/tests/test_pipeline_conformance.py::TestConformance::"
        "test_registration_imports_and_builds[partitioners/pipeline]",
    # Renamed: the commands are their own typer apps, the optimizers chosen by their names.
    "tests/test_hook_docs.py::test_every_module_attr_named_in_the_reference_imports"
    "[pax_lm.commands.decode:app]": "tests/test_hook_docs.py::"
    "test_every_module_attr_named_in_the_reference_imports[pax_lm.commands.decode:decode]",
    "tests/test_optimizers.py::test_each_optimizer_trains_the_mlp[Adafactor]":
        "tests/test_optimizers.py::test_each_optimizer_trains_the_mlp[adafactor]",
    "tests/test_optimizers.py::test_each_optimizer_trains_the_mlp[Lion]":
        "tests/test_optimizers.py::test_each_optimizer_trains_the_mlp[lion]",
    # The package list names each package's folder of modules, one level down.
    **{f"{_API}[{old}]": f"{_API}[{new}]" for old, new in _SOURCES.items()},
    # The train test shares the session's trained job and checks that it learned.
    "pax_speech/tests/test_speech_cli.py::test_train_reports_ctc_loss_and_error_rates":
        "pax_speech/tests/test_speech_cli.py::test_train_learns_and_reports_ctc_loss_and_error_"
        "rates",
    # A damaged gs:// checkpoint is now found by a resume, which passes over it.
    "tests/test_remote_jobdir.py::test_a_damaged_gs_checkpoint_is_named_set_aside_and_the_one_"
    "before_restored": "tests/test_remote_jobdir.py::test_a_damaged_gs_checkpoint_is_named_"
                       "passed_over_and_set_aside_by_a_resume",
    # The sweep moved to pax-sweep (its own session): its runners and its algorithms' tests.
    "tests/test_hook_docs.py::test_every_module_attr_named_in_the_reference_imports"
    "[pax_core.sweep.runners:LocalRunner]":
        "tests/test_hook_docs.py::test_every_module_attr_named_in_the_reference_imports"
        "[pax_sweep.runners:LocalRunner]",
    "tests/test_hook_docs.py::test_every_public_name_cited_exists[TrialRunner]":
        "tests/test_hook_docs.py::test_every_module_attr_named_in_the_reference_imports"
        "[pax_sweep.runners:LocalRunner]",
    "tests/test_sweep.py::test_each_algorithm_takes_feedback_on_recorded_choices[grid]":
        "plugins/pax_sweep/tests/test_sweep.py::test_grid_search_given_recorded_feedback_"
        "proposes_only_the_rest",
    "tests/test_sweep.py::test_each_algorithm_takes_feedback_on_recorded_choices[random]":
        "plugins/pax_sweep/tests/test_sweep.py::test_random_search_given_recorded_feedback_"
        "draws_what_follows_it",
    "tests/test_sweep.py::test_each_algorithm_takes_feedback_on_recorded_choices[evolution]":
        "plugins/pax_sweep/tests/test_sweep.py::test_evolution_given_feedback_breeds_from_the_"
        "best_recorded_choices",
}

# Refusals checked once through the command and then, item by item, in-process (one test per
# kind of refusal runs `pax`; its parameters moved to an in-process test beside it).
_REFUSALS = {
    "pax_lm/tests/test_lm.py::test_bad_input_is_one_clear_line":
        "pax_lm/tests/test_lm.py::test_each_bad_input_is_refused_before_anything_is_written",
    "pax_speech/tests/test_speech_cli.py::test_bad_input_is_one_line_and_exit_2_with_nothing_"
    "written": "pax_speech/tests/test_speech_cli.py::test_each_bad_input_is_refused_before_"
               "anything_is_written",
    "tests/test_checkpoint_keeping.py::test_a_duration_that_does_not_read_is_refused":
        "tests/test_checkpoint_keeping.py::test_each_duration_that_does_not_read_is_refused",
    "tests/test_faults.py::test_a_learning_rate_that_is_not_a_positive_number_is_refused":
        "tests/test_faults.py::test_each_learning_rate_that_is_not_a_positive_number_is_refused",
    "tests/test_optimizers.py::test_bad_optimizer_settings_are_one_line":
        "tests/test_optimizers.py::test_bad_optimizer_settings_and_names_are_refused_before_"
        "anything_is_written",
    "tests/test_remote_jobdir.py::test_a_job_dir_pax_cannot_use_is_refused":
        "tests/test_remote_jobdir.py::test_each_job_dir_pax_cannot_use_is_refused",
    "tests/test_run_speed.py::test_a_bad_profile_window_is_refused_before_anything_is_written":
        "tests/test_run_speed.py::test_each_bad_profile_window_is_a_usage_error",
    # A damaged record: one trained job, each damage tried on it (train and eval).
    "tests/test_jobdir.py::test_a_damaged_runs_record_is_named_and_nothing_changes":
        "tests/test_jobdir.py::test_a_damaged_runs_record_is_named_and_nothing_changes",
}


def covered_by(nodeid: str) -> str | None:
    """The test that covers a test id the measurement before had and this one has not."""
    if nodeid in COVERED_BY:
        return COVERED_BY[nodeid]
    function = nodeid.split("[")[0]
    if function in _REFUSALS:  # a parametrized refusal
        return _REFUSALS[function]
    if function == "pax_lm/tests/test_plan.py::test_experiments_compile_on_their_mesh":
        # The experiments planned on one device count share one process (its three groups).
        return function + "[8-devices|512-devices|1024-devices]"
    return None


def _measure_once(scratch: Path) -> dict:
    clone, times = scratch / "clone", scratch / "times"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    env = {**os.environ, "CI": "true", "PAX_TEST_TIMES": str(times),
           "UV_CACHE_DIR": str(scratch / "uv-cache")}
    env.pop("PAX_CACHE_DIR", None)
    log = scratch / "ci.log"
    with open(log, "w") as out:
        code = subprocess.run(["bash", ".ci/run"], cwd=clone, stdout=out, stderr=out,
                              env=env).returncode
    print(log.read_text()[-1500:])
    if code != 0:
        failed = [line for line in log.read_text().splitlines() if line.startswith("FAILED ")]
        print("\n".join(failed))
        sys.exit(f".ci/run failed (exit {code}); its output is kept: {log} (--read "
                 f"{scratch} records it)")
    return _read(scratch)


def _read(scratch: Path) -> dict:
    """The times a run of .ci/run left in ``scratch``, failed tests' included."""
    times = scratch / "times"
    sessions = {}
    for line in (times / "sessions.tsv").read_text().splitlines():
        name, seconds = line.split("\t")
        sessions[name] = int(seconds)
    tests: dict[str, dict] = {}
    for path in sorted(times.glob("*-*.json")):
        record = json.loads(path.read_text())
        for nodeid, test in record["tests"].items():
            tests[f"{record['session']} {nodeid}"] = test
    # A session's failures that its pytest runs did not record (plugin_kit's generated plugin).
    log = scratch / "ci.log"
    failed = [line.split(" - ")[0].removeprefix("FAILED ") for line in
              (log.read_text().splitlines() if log.exists() else [])
              if line.startswith("FAILED ")]
    for nodeid in failed:
        if not any(key.endswith(f" {nodeid}") for key in tests):
            tests[f"unrecorded {nodeid}"] = {"seconds": 0.0, "outcome": "failed"}
    clone = scratch / "clone"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=clone,
                            capture_output=True, text=True).stdout.strip() if clone.exists() else ""
    # .ci/run's own wall time (its lanes overlap; older runs left none: their sum).
    total = sessions.pop("total", sum(sessions.values()))
    return {"sessions": sessions, "total": total, "tests": tests, "commit": commit}


def _from_junit(folder: Path, ids_file: Path) -> dict:
    sessions = {}
    for line in (folder / "times.txt").read_text().splitlines():
        name, _, seconds = line.split()
        sessions[name] = int(seconds.rstrip("s"))
    tests = {}
    for junit in sorted(folder.glob("junit-*.xml")):
        session = junit.stem.removeprefix("junit-")
        for case in ET.parse(junit).getroot().iter("testcase"):
            module = case.get("classname").split(".")
            cls = [module.pop()] if module[-1][:1].isupper() else []
            path = "/".join(module) + ".py"
            if session != "tests":  # those sessions ran pytest on a folder below the root
                path = {"seqio": "plugins/pax_seqio/", "ray": "plugins/pax_ray/"}.get(
                    session, "") + path
            nodeid = "::".join([path, *cls, case.get("name")])
            outcome = ("failed" if case.find("failure") is not None else
                       "skipped" if case.find("skipped") is not None else "passed")
            tests[f"{session} {nodeid}"] = {"seconds": float(case.get("time")),
                                            "outcome": outcome}
    run = {"sessions": sessions, "total": sum(sessions.values()), "tests": tests}
    ids = sorted({line.strip() for line in ids_file.read_text().splitlines() if "::" in line})
    return _summary([run], ids)


def _ids_of(runs: list[dict]) -> list[str]:
    return sorted({key.split(" ", 1)[1] for run in runs for key in run["tests"]})


def _summary(runs: list[dict], ids: list[str] | None = None) -> dict:
    files: dict[str, list[float]] = {}
    tests: dict[str, list[float]] = {}
    for run in runs:
        per_file: dict[str, float] = {}
        for key, test in run["tests"].items():
            session, nodeid = key.split(" ", 1)
            tests.setdefault(key, []).append(test["seconds"])
            if session == "tests":
                name = nodeid.split("::")[0]
                per_file[name] = per_file.get(name, 0.0) + test["seconds"]
        for name, seconds in per_file.items():
            files.setdefault(name, []).append(seconds)
    return {
        "measured": datetime.date.today().isoformat(),
        "commit": " and ".join(sorted({r["commit"] for r in runs if r.get("commit")})) or
                  subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                 capture_output=True, text=True).stdout.strip(),
        "machine": f"{os.cpu_count()} cores",
        "runs": [{"sessions": r["sessions"], "total": r["total"]} for r in runs],
        "files": {k: round(statistics.mean(v), 1)
                  for k, v in sorted(files.items(), key=lambda kv: -statistics.mean(kv[1]))},
        "tests": {k: round(statistics.mean(v), 2)
                  for k, v in sorted(tests.items(), key=lambda kv: -statistics.mean(kv[1]))},
        "outcomes": {k: v["outcome"] for r in runs for k, v in r["tests"].items()},
        "ids": ids if ids is not None else _ids_of(runs),
    }


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _table(now: dict, before: dict | None) -> str:
    sessions = list(now["runs"][0]["sessions"])
    head = ["session", *[f"run {i + 1}" for i in range(len(now["runs"]))]]
    if before:
        head.append(f"before ({before['commit']})")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" + " ---: |" * (len(head) - 1)]
    for name in [*sessions, "total"]:
        cells = [f"{(r['sessions'].get(name) if name != 'total' else r['total']) or 0:,} s"
                 for r in now["runs"]]
        if before:
            old = before["runs"][0]
            value = old["total"] if name == "total" else old["sessions"].get(name)
            cells.append("-" if value is None else f"{value:,} s")
        label = f"**{name}**" if name == "total" else name
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _report(now: dict, before: dict | None) -> str:
    totals = [r["total"] for r in now["runs"]]
    out = [f"# CI's time\n\nMeasured {now['measured']} at {now['commit']} on {now['machine']}, "
           f"nothing else running: `python3 bench/test_times.py --runs {len(totals)}` (a clean "
           f"clone's `bash .ci/run`, an empty uv cache). Total: "
           + ", ".join(_minutes(t) for t in totals)
           + (f"; before: {_minutes(before['runs'][0]['total'])}." if before else ".")
           + "\n", _table(now, before), "",
           "After `tests`, .ci/run runs the other sessions in lanes side by side: their "
           "times overlap, and the total is .ci/run's own, start to end.\n"]
    if before:
        out.append("'setup' is apt-get and `pip install nox uv`. Before, `tests` stopped at "
                   "a failing test ahead of its serial part, and 'setup' was not timed.\n")
    failed = sorted(k for k, v in now["outcomes"].items() if v == "failed")
    if failed:
        out.append("**Failed** in the measured runs (their times are those of the failure):\n")
        out.extend(f"- `{key}`" for key in failed)
        out.append("\nA session whose first pytest run fails does not start its second (the "
                   "`serial` tests): their ids are missing below.\n")
    out.append(f"## The {TOP} longest test files (session `tests`, summed over their tests)\n")
    out.append("| file | seconds |" + (" before |" if before else "") + "\n| --- | ---: |"
               + (" ---: |" if before else ""))
    for name, seconds in list(now["files"].items())[:TOP]:
        old = f" {before['files'].get(name, 0):.1f} |" if before else ""
        out.append(f"| `{name}` | {seconds:.1f} |{old}")
    out.append(f"\n## The {TOP} longest tests\n\n| test | seconds |\n| --- | ---: |")
    for key, seconds in list(now["tests"].items())[:TOP]:
        out.append(f"| `{key}` | {seconds:.1f} |")
    out.append(f"\n## Test ids\n\n{len(now['ids'])} ids now"
               + (f", {len(before['ids'])} before." if before else "."))
    if before:
        removed = sorted(set(before["ids"]) - set(now["ids"]))
        added = sorted(set(now["ids"]) - set(before["ids"]))
        out.append(f"{len(added)} added, {len(removed)} no longer exist; each of those names the "
                   "test that covers it now:\n")
        recorded = {nodeid.split("::")[0] for nodeid in now["ids"]}
        for nodeid in removed:
            if nodeid.split("::")[0] not in recorded:
                out.append(f"- `{nodeid}`: not recorded (its session kept no test times)")
                continue
            cover = covered_by(nodeid)
            out.append(f"- `{nodeid}`: " + (f"`{cover}`" if cover else "**NOT COVERED**"))
        if added:
            out.append("\nAdded:\n")
            out.extend(f"- `{nodeid}`" for nodeid in added)
    return "\n".join(out) + "\n"


def budgets(files: dict[str, float], default: float) -> dict[str, int]:
    """The per-file budgets of measured ``files`` (see the module's docstring), longest first."""
    out = {}
    for name, seconds in sorted(files.items(), key=lambda kv: -kv[1]):
        if 2 * seconds > default:
            out[name] = int(-(-max(2 * seconds, seconds + 60) // 10) * 10)
    return out


def _print_budgets() -> None:
    import tomllib

    default = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "tool"]["pax"]["test-budget"]["file_seconds"]
    files = json.loads((report.FOLDER / "test_times.json").read_text())["files"]
    for name, seconds in budgets(files, default).items():
        print(f'"{name}" = {seconds}  # {files[name]:.0f} s measured')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--from-junit", type=Path)
    parser.add_argument("--ids", type=Path)
    parser.add_argument("--read", type=Path, nargs="+",
                        help="record the runs whose folders a failed measurement kept")
    parser.add_argument("--budgets", action="store_true",
                        help="print the per-file budgets of the last measurement")
    args = parser.parse_args()
    if args.budgets:
        _print_budgets()
        return
    if args.from_junit:
        BEFORE.parent.mkdir(exist_ok=True)
        BEFORE.write_text(json.dumps(_from_junit(args.from_junit, args.ids), indent=1))
        print(f"wrote {BEFORE}")
        return
    before = json.loads(BEFORE.read_text()) if BEFORE.exists() else None
    runs = [_read(folder) for folder in args.read or []]
    for i in range(0 if args.read else args.runs):
        scratch = Path(tempfile.mkdtemp(prefix="pax-ci-times-"))
        print(f"run {i + 1} of {args.runs}: bash .ci/run in a clean clone in {scratch}",
              flush=True)
        runs.append(_measure_once(scratch))
        shutil.rmtree(scratch)  # kept when the run failed
        now = _summary(runs)  # written after every run: a long measurement keeps what it has
        report.save("test_times", now, _report(now, before))
    if args.read:
        now = _summary(runs)
        report.save("test_times", now, _report(now, before))


if __name__ == "__main__":
    main()
