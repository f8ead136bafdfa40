"""No two modules of a package import each other, directly or through a cycle, and no two of its
sub-packages do either: each package's imports run one way, so a module can be read, tested and
moved with what it needs and nothing that needs it.

The graph is read from the source (every ``import``, at module level or inside a function, since
a deferred import is still a dependency), per distribution: the core, each plugin package and
each modality.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from repo_packages import PACKAGES, ROOT


def _module_name(package: str, source: Path, path: Path) -> str:
    parts = [package, *path.relative_to(source).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, module: str) -> Iterator[str]:
    """Every name ``module`` (the file ``path``) imports, with each ``from X import y`` given as
    both ``X`` and ``X.y`` (``y`` may be a module)."""
    here = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1]) if node.level else ""
            target = ".".join(p for p in (base, node.module or "") if p)
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def import_graph(package: str, source: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    modules = {_module_name(package, source, p): p for p in source.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for name in _imported(path, module):
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name not in (module, package):
                graph[module].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _subpackage(module: str) -> str:
    return ".".join(module.split(".")[:2])


def subpackage_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same imports between sub-packages (``pax_core.run``, ``pax_lm.data``; a top-level
    module counts as its own)."""
    out: dict[str, set[str]] = {}
    for module, names in graph.items():
        out.setdefault(_subpackage(module), set()).update(
            _subpackage(n) for n in names if _subpackage(n) != _subpackage(module))
    return out


SOURCES = [(p.module, ROOT / p.source) for p in PACKAGES]


@pytest.mark.parametrize(("package", "source"), SOURCES, ids=[m for m, _ in SOURCES])
def test_no_two_modules_import_each_other(package, source):
    assert cycles(import_graph(package, source)) == []


@pytest.mark.parametrize(("package", "source"), SOURCES, ids=[m for m, _ in SOURCES])
def test_no_two_subpackages_import_each_other(package, source):
    assert cycles(subpackage_graph(import_graph(package, source))) == []


def test_a_cycle_is_found_however_long():
    graph = {"a.x": {"a.y"}, "a.y": {"a.z"}, "a.z": {"a.x"}, "a.w": {"a.x"}}
    assert cycles(graph) == [["a.x", "a.y", "a.z"]]
    assert cycles(subpackage_graph({"p.a.m": {"p.b.n"}, "p.b.n": {"p.c"}, "p.c": {"p.a.k"},
                                    "p.a.k": set()})) == [["p.a", "p.b", "p.c"]]


def test_a_deferred_import_counts(tmp_path):
    (tmp_path / "one.py").write_text("def f():\n    from pkg import two\n")
    (tmp_path / "two.py").write_text("from pkg.one import f\n")
    (tmp_path / "__init__.py").write_text("")
    assert cycles(import_graph("pkg", tmp_path)) == [["pkg.one", "pkg.two"]]
