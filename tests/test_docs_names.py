"""What the user-facing pages name is so: every experiment they give to ``--exp`` is registered,
and every class-like name they mention is a registered experiment or a public name of one of
the repository's packages (or one of the few outside names listed below, with why).

The listing of experiments users read (``pax experiments``) is generated from the registry; this
keeps the prose about the catalogue (README.md, each package's README, the guides under docs/)
from naming one that was renamed or never existed. docs/architecture.md, which is about the
core's insides, names private modules and classes on purpose; docs/hooks.md is generated and
checked by tests/test_hook_docs.py.
"""

from __future__ import annotations

import ast
import importlib
import re

import pytest
from repo_packages import PACKAGES, ROOT

import pax_core
from pax_core.config import lookup
from pax_core.errors import UsageError
from pax_core.testing import PluginHost

NOT_GUIDES = {"docs/architecture.md", "docs/hooks.md"}
PAGES = ["README.md", *sorted(
    str(p) for p in (q.relative_to(ROOT) for q in ROOT.glob("docs/*.md"))
    if str(p) not in NOT_GUIDES), *sorted(
    str(p) for p in (q.relative_to(ROOT) for q in ROOT.glob("*/**/README.md"))
    if not any(part.startswith(".") or part == "templates" for part in p.parts))]
# Names of other projects, and Python's, that the pages mention on purpose.
OUTSIDE = {
    "DeprecationWarning", "OSError", "ValueError", "False",  # Python's
    "ShardInfo",  # SeqIO's sharding of a split over processes
    "ShardedAdafactor",  # Pax's optimizer, which Adafactor reproduces
    "Fp8DirectDotGeneralOp",  # Flax's FP8 matmul
}
# `--exp` arguments that are placeholders or what `pax plugins new` renders.
PLACEHOLDERS = re.compile(r"^(E|\.\.\.|path|my_\w+(\.\w+)*|[A-Z][a-z]+Sine)$")
TOKEN = re.compile(r"`([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)`")
EXP = re.compile(r"--exp[ =]([A-Za-z0-9_.]+)")


def _public_names() -> set[str]:
    """``pax_core``'s and its testing companion's names, and every package's public face (read
    from the source for the packages this environment does not install)."""
    names = set(pax_core.__all__) | set(pax_core._MOVED) | set(pax_core.testing.__all__)
    for package in PACKAGES:
        try:
            names |= set(getattr(importlib.import_module(package.module), "__all__", ()))
        except ModuleNotFoundError:
            tree = ast.parse((ROOT / package.source / "__init__.py").read_text())
            names |= {key.value for node in ast.walk(tree) if isinstance(node, ast.Dict)
                      for key in node.keys if isinstance(key, ast.Constant)}
    return names


@pytest.fixture(scope="module")
def registry():
    return PluginHost().components("experiments")


def _registered(registry, name: str) -> bool:
    try:
        return lookup.find_registered(registry, name) is not None
    except UsageError as e:  # unknown, or registered twice (ambiguous)
        return "is ambiguous" in str(e)


@pytest.mark.parametrize("page", PAGES)
def test_every_experiment_a_page_runs_is_registered(page, registry):
    text = (ROOT / page).read_text()
    missing = [name for name in EXP.findall(text)
               if not PLACEHOLDERS.match(name) and not _registered(registry, name)]
    assert not missing, f"{page} runs experiments that are not registered: {missing}"


@pytest.mark.parametrize("page", PAGES)
def test_every_name_a_page_mentions_exists(page, registry):
    known = _public_names() | OUTSIDE
    text = (ROOT / page).read_text()
    unknown = sorted({name for name in TOKEN.findall(text)
                      if name not in known and not _registered(registry, name)})
    assert not unknown, (f"{page} names what is neither a registered experiment nor a public "
                         f"name: {unknown}")
