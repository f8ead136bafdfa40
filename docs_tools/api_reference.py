"""The API reference pages: one a package, listing its public face and nothing else.

A package's public face is its ``__all__``; each name is imported on first use from the module
``_EXPORTS`` maps it to (``pax_core.public_face``), so no static reader sees it in the package
itself. The page therefore names each object where it is defined, for mkdocstrings to read from
the source (griffe, without importing it), under its public spelling (``pax_lm.LanguageModel``).

The face is read by running the package's ``__init__.py`` alone, which by design imports
nothing heavy (``pax_core`` at most), so the packages tested in sessions of their own
(TensorFlow's pax-seqio, Ray's pax-ray) are documented without installing them.
"""

from __future__ import annotations

import dataclasses
import runpy
import tomllib
from pathlib import Path

# The order of the reference: the core, the modalities, then the plugin packages.
FIRST = ("pax_core", "pax_lm", "pax_vision", "pax_speech")


@dataclasses.dataclass(frozen=True)
class Package:
    module: str  # the import name
    source: Path  # its folder, holding __init__.py

    @property
    def page(self) -> str:
        return f"reference/api/{self.module}.md"


def packages(root: Path) -> list[Package]:
    """The repository's packages (``pyproject.toml``'s ``[tool.pax]``) but its test plugin, in
    the reference's order."""
    listed = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pax"]["packages"]
    found = [Package(p["module"], root / p["source"]) for p in listed
             if not p["source"].startswith("tests/")]
    return sorted(found, key=lambda p: (p.module not in FIRST,
                                        FIRST.index(p.module) if p.module in FIRST else 0,
                                        p.module))


def nav(root: Path) -> list[dict[str, str]]:
    """The navigation's API section: each package's title and page."""
    return [{p.module: p.page} for p in packages(root)]


def testing_modules(root: Path) -> list[str]:
    """The import names of the repository's packages that exist for its tests alone."""
    listed = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pax"]["packages"]
    return [p["module"] for p in listed if p["source"].startswith("tests/")]


def public_face(package: Package) -> tuple[str, dict[str, str]]:
    """The package's docstring, and its public names -> where each is defined (the package
    itself for a name it defines, such as ``__version__``)."""
    namespace = runpy.run_path(str(package.source / "__init__.py"), run_name=package.module)
    exports = namespace.get("_EXPORTS", {})
    names = namespace.get("__all__", [])
    return namespace.get("__doc__") or "", {name: _target(package.module, exports, name)
                                           for name in names}


def _target(package: str, exports: dict[str, str], name: str) -> str:
    """Where ``name`` is defined: in the module ``exports`` names (a module exported under its
    own name, such as ``pax_core.axes``, is that module), else in the package itself."""
    if name not in exports:
        return f"{package}.{name}"
    module = exports[name]
    return module if module.rsplit(".", 1)[-1] == name else f"{module}.{name}"


def _modules_first(item: tuple[str, str]) -> tuple[bool, str]:
    """Version constants last, the rest alphabetically."""
    name = item[0]
    return name.isupper() or name.startswith("__"), name.lower()


def render(package: Package) -> str:
    """The package's page: its docstring, then each public name's documentation."""
    doc, face = public_face(package)
    lines = [f"# {package.module}", "", doc.strip(), ""]
    if not face:
        lines += [f"`{package.module}` exports no Python names: it is used through the plugin "
                  f"it registers (`pax plugins` lists what it adds).", ""]
        return "\n".join(lines)
    ordered = sorted(face.items(), key=_modules_first)
    lines += [f"Import these from `{package.module}` itself "
              f"(`from {package.module} import {ordered[0][0]}`); the modules that define "
              f"them may move between releases.", ""]
    for name, target in ordered:
        lines += [f"::: {target}", "    options:", f"      heading: \"{package.module}.{name}\"",
                  f"      toc_label: \"{name}\"", ""]
    return "\n".join(lines)
