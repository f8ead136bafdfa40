"""The repository's packages, as ``pyproject.toml``'s ``[tool.pax]`` lists them: what the tests
that cover every package (imports, the public API) iterate over."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Package:
    module: str  # the import name
    source: str  # its folder of modules, from the repository's root
    tests: str  # its tests
    install: str  # what `pip install -e` takes to install it with its test extras
    session: str = "tests"  # the nox session that tests it


PACKAGES = [Package(**p) for p in
            tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pax"]["packages"]]
