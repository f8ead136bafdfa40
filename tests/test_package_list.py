"""``pyproject.toml``'s list of packages (``[tool.pax]``) is the one list: what TOML cannot
derive from it is checked against it here."""

from __future__ import annotations

import tomllib

from repo_packages import PACKAGES, ROOT

SETTINGS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]


def test_every_package_is_listed_once_and_exists():
    modules = [p.module for p in PACKAGES]
    assert len(set(modules)) == len(modules)
    for package in PACKAGES:
        assert (ROOT / package.source / "__init__.py").is_file(), package
        assert (ROOT / package.tests).is_dir(), package
    on_disk = {p.parent.name for p in ROOT.glob("plugins/*/pyproject.toml")}
    on_disk |= {p.parent.name for p in ROOT.glob("pax_*/pyproject.toml")}
    assert on_disk <= {p.source.split("/")[1] if p.source.startswith("plugins/")
                       else p.source.split("/")[0] for p in PACKAGES}


def test_pytest_runs_the_tests_of_the_packages_the_tests_session_installs():
    expected = {p.tests for p in PACKAGES if p.session == "tests"}
    assert set(SETTINGS["pytest"]["ini_options"]["testpaths"]) == expected


def test_ruff_sorts_every_package_as_first_party():
    known = SETTINGS["ruff"]["lint"]["isort"]["known-first-party"]
    assert sorted(known) == sorted(p.module for p in PACKAGES)


def test_every_package_carries_the_license_it_declares():
    """Every wheel holds the license's text: setuptools puts a project's LICENSE into its
    wheel, so each package's project folder has one, the repository's."""
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0" in text
    for package in PACKAGES:
        project = ROOT / package.install.split("[")[0]
        declared = tomllib.loads((project / "pyproject.toml").read_text())["project"]
        assert declared["license"] == "Apache-2.0", project
        assert (project / "LICENSE").read_text() == text, project
