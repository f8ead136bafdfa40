"""Where every benchmark leaves its results: ``bench/results/NAME.json`` (the numbers) and
``NAME.md`` (the table, also printed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FOLDER = Path(__file__).resolve().parent / "results"


def save(name: str, data: Any, table: str) -> Path:
    """Write ``data`` as JSON and ``table`` as markdown under ``FOLDER``, print the table."""
    FOLDER.mkdir(exist_ok=True)
    (FOLDER / f"{name}.json").write_text(json.dumps(data, indent=1))
    (FOLDER / f"{name}.md").write_text(table.rstrip("\n") + "\n")
    print(table)
    return FOLDER
