"""The hook reference: docs/hooks.md is current, and every name it cites exists."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

import pax_core
from pax_core.plugins import hookspecs, reference
from pax_core.plugins.records import Component

ROOT = Path(__file__).resolve().parents[1]


def test_docs_hooks_md_is_generated_from_the_specs():
    page = (ROOT / "docs" / "hooks.md").read_text()
    assert page == reference.render(), (
        "docs/hooks.md is stale: run python -m pax_core.plugins.reference docs/hooks.md")


def test_every_hook_is_documented_with_its_processes():
    names = reference.hook_names()
    assert len(names) == 14
    for name in names:
        doc = " ".join((getattr(hookspecs, name).__doc__ or "").split())
        assert len(doc.split()) >= 15, f"{name} is barely documented"
        if name.startswith("pax_on_"):
            assert "every process" in doc, f"{name} does not say where it runs"


@pytest.mark.parametrize("target", sorted(set(reference.TARGET.findall(
    reference.documented_text()))))
def test_every_module_attr_named_in_the_reference_imports(target):
    assert Component("doc", target).load() is not None


@pytest.mark.parametrize("name", sorted(set(reference.PUBLIC.findall(
    reference.documented_text()))))
def test_every_public_name_cited_exists(name):
    assert name in pax_core.__all__ or importlib.util.find_spec(f"pax_core.{name}"), name
