"""`pax plugins new`: what it writes, and what it refuses. (The package it writes is installed
from wheels into a fresh venv, tested and trained by `nox -s plugin_kit`.)"""

from __future__ import annotations

import tomllib

import pytest
from packaging.specifiers import SpecifierSet
from repo_packages import ROOT

import pax_core
from pax_core.plugins import kit
from pax_core.testing import run_pax

MODALITY = ["LICENSE", "README.md", "pyproject.toml", "src/pax_my_task/__init__.py",
            "src/pax_my_task/experiments.py", "src/pax_my_task/inputs.py",
            "src/pax_my_task/models.py", "src/pax_my_task/plugin.py", "tests/conftest.py",
            "tests/test_my_task_conformance.py", "tests/test_my_task_train.py"]


def test_modality_package_is_complete_and_valid(tmp_path):
    result = run_pax("plugins", "new", "my_task", "--output", str(tmp_path / "pkg"))
    assert result.returncode == 0, result.stderr
    root = tmp_path / "pkg"
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert files == MODALITY
    for path in root.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")
        assert "{{" not in path.read_text(), path
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["name"] == "pax-my-task"
    assert project["license"] == "Apache-2.0"
    assert (root / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    assert project["entry-points"]["pax"] == {"my_task": "pax_my_task.plugin"}
    core = next(d for d in project["dependencies"] if d.startswith("pax-core"))
    assert pax_core.__version__ in SpecifierSet(core.removeprefix("pax-core"))
    plugin = (root / "src/pax_my_task/plugin.py").read_text()
    api = plugin.split('PAX_API = "')[1].split('"')[0]
    assert pax_core.API_VERSION in SpecifierSet(api)
    experiments = (root / "src/pax_my_task/experiments.py").read_text()
    assert "class MyTaskSine(SingleTaskExperiment)" in experiments


def test_backend_package_adds_a_registered_backend(tmp_path):
    written = kit.new_plugin("fast", tmp_path / "pkg", backend=True)
    assert "src/pax_fast/backends.py" in [str(p) for p in written]
    assert "tests/test_fast_backend.py" in [str(p) for p in written]
    plugin = (tmp_path / "pkg/src/pax_fast/plugin.py").read_text()
    assert 'Component("cpu", "pax_fast.backends:FastBackend"' in plugin


@pytest.mark.parametrize("name", ["9lives", "My-Task", "core", "class"])
def test_a_bad_name_is_a_usage_error(tmp_path, name):
    result = run_pax("plugins", "new", name, "--output", str(tmp_path / "pkg"))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "plugin name" in result.stderr
    assert not (tmp_path / "pkg").exists()


def test_an_existing_folder_is_never_overwritten(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mine.txt").write_text("keep")
    result = run_pax("plugins", "new", "demo", "--output", str(tmp_path / "pkg"))
    assert result.returncode == 2 and "nothing was written" in result.stderr
    assert [p.name for p in (tmp_path / "pkg").iterdir()] == ["mine.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["pkg"]  # no staging folder left behind
    both = run_pax("plugins", "new", "demo", "--modality", "--backend", "--output",
                   str(tmp_path / "other"))
    assert both.returncode == 2 and not (tmp_path / "other").exists()
