"""The hook reference: docs/hooks.md is current, and every name it cites exists."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
from repo_packages import PACKAGES, ROOT

import pax_core
from pax_core.plugins import hookspecs, reference
from pax_core.plugins.records import Component


def test_docs_hooks_md_is_generated_from_the_specs():
    page = (ROOT / "docs" / "hooks.md").read_text()
    assert page == reference.render(), (
        "docs/hooks.md is stale: run python -m pax_core.plugins.reference docs/hooks.md")


def test_every_hook_is_documented_with_its_processes():
    names = reference.hook_names()
    assert len(names) == 16
    for name in names:
        doc = " ".join((getattr(hookspecs, name).__doc__ or "").split())
        assert len(doc.split()) >= 15, f"{name} is barely documented"
        if name.startswith("pax_on_"):
            assert "every process" in doc, f"{name} does not say where it runs"


@pytest.mark.parametrize("target", sorted(set(reference.TARGET.findall(
    reference.documented_text()))))
def test_every_module_attr_named_in_the_reference_imports(target):
    """Imported, or, for a package tested in a session of its own (not installed here), found
    defined at the top of its module's source."""
    module, _, attr = target.partition(":")
    package = next((p for p in PACKAGES if p.module == module.split(".")[0]), None)
    if package is not None and package.session != "tests":
        path = ROOT / package.source / Path(*module.split(".")[1:]).with_suffix(".py")
        tree = ast.parse(path.read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef)}
        defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                    if isinstance(t, ast.Name)}
        assert attr in defined, f"{path} defines no {attr}"
        return
    assert Component("doc", target).load() is not None


@pytest.mark.parametrize("name", sorted(set(reference.PUBLIC.findall(
    reference.documented_text()))))
def test_every_public_name_cited_exists(name):
    assert name in pax_core.__all__ or importlib.util.find_spec(f"pax_core.{name}"), name
