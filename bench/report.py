"""Where every benchmark leaves its results: ``bench/results/NAME.json`` (the numbers) and
``NAME.md`` (the table, also printed).

Each result names where it came from (``provenance``): the commit it was measured at, whether
the working tree held uncommitted changes then, the date and the command, so that a figure
quoted from it (the documentation's tables are generated from these files by ``doc_tables.py``)
can be measured again.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "bench" / "results"


def _git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True)
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist, say)
        return None
    return done.stdout.strip()


def _command() -> str:
    """This process's command line, the script relative to the repository when inside it."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return " ".join(["python", str(shown), *sys.argv[1:]])


def provenance() -> dict[str, Any]:
    """The commit (``git rev-parse --short HEAD``), whether tracked files differed from it,
    the UTC date, this process's command, and how busy the machine was (the load average over
    the last 15 minutes against its cores: timings from a shared machine are only as good as
    its quiet)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": _git("rev-parse", "--short", "HEAD"),
            "uncommitted_changes": None if status is None else bool(status),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
            "command": _command(),
            "load_average_15min": round(os.getloadavg()[2], 2),
            "cores": os.cpu_count()}


def describe(found: dict[str, Any]) -> str:
    """One line saying where a result came from, for its table and the documentation's."""
    dirty = " with uncommitted changes" if found.get("uncommitted_changes") else ""
    load = (f" (load average {found['load_average_15min']:.1f} on {found['cores']} cores)"
            if "load_average_15min" in found else "")
    return (f"Measured at commit {found.get('commit') or 'unknown'}{dirty} on "
            f"{found['date']}{load}: `{found['command']}`.")


def save(name: str, data: Any, table: str) -> Path:
    """Write ``data`` as JSON and ``table`` as markdown under ``FOLDER``, print the table.

    A dict gains ``provenance`` (unless it has one, or names its own ``commit``, as a
    measurement of another checkout does), and the table a line saying it."""
    FOLDER.mkdir(exist_ok=True)
    if isinstance(data, dict) and "provenance" not in data and "commit" not in data:
        data = {**data, "provenance": provenance()}
    if isinstance(data, dict) and "provenance" in data:
        table = table.rstrip("\n") + "\n\n" + describe(data["provenance"])
    (FOLDER / f"{name}.json").write_text(json.dumps(data, indent=1))
    (FOLDER / f"{name}.md").write_text(table.rstrip("\n") + "\n")
    print(table)
    return FOLDER


def kept(name: str, key: str, label: str, measured: list[dict]) -> list[dict]:
    """The entries under ``key`` of the committed results ``name`` that ``measured`` does not
    replace (none of its entries has the same ``label``), each with the provenance the file
    gave it unless it names its own: measuring some of a file's rows keeps the others."""
    path = FOLDER / f"{name}.json"
    if not path.exists():
        return []
    earlier = json.loads(path.read_text())
    replaced = {m[label] for m in measured}
    found = [e for e in earlier[key] if e[label] not in replaced]
    if "provenance" in earlier:
        found = [{"provenance": earlier["provenance"], **e} for e in found]
    return found

