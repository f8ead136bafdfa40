"""MkDocs hooks (``mkdocs.yml``'s ``hooks``): the pages written from the code when the site is
built, so that none of them is kept by hand beside what it describes.

* ``reference/cli.md``: every ``pax`` command, from the command-line application
  (``cli_reference``);
* ``reference/api/PACKAGE.md``: each package's public face (``api_reference``), read by
  mkdocstrings;
* ``tests.md`` gains README.md's "Tests" section, the one account of how the tests run, where
  its ``<!-- readme:tests -->`` marker stands.

``hooks.md`` stays a committed file, for readers of the repository; the build stops when it
differs from what ``python -m pax_core.plugins.reference docs/hooks.md`` writes.
"""

from __future__ import annotations

import re
from pathlib import Path

import api_reference
import cli_reference
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

from pax_core.plugins import reference
from pax_core.plugins.host import PluginHost, PluginSelection

_SECTION = re.compile(r"^## Tests\n(.*?)(?=^## |\Z)", re.DOTALL | re.MULTILINE)
_MARKER = "<!-- readme:tests -->"


def _root(config: MkDocsConfig) -> Path:
    return Path(config.config_file_path).resolve().parent


def readme_tests(readme: str) -> str:
    """README.md's "Tests" section, without its heading."""
    found = _SECTION.search(readme)
    if found is None:
        raise PluginError("README.md has no '## Tests' section for the tests page")
    return found.group(1).strip()


def on_config(config: MkDocsConfig) -> MkDocsConfig:
    """The navigation's API section: a page for each package, in the reference's order."""
    sections = [entry["API"] for entry in _walk(config.nav)
                if isinstance(entry, dict) and "API" in entry]
    if len(sections) != 1 or sections[0] != []:
        raise PluginError("mkdocs.yml's nav needs one empty 'API: []' section for the API pages")
    sections[0].extend(api_reference.nav(_root(config)))
    return config


def _walk(nav: list) -> list:
    """Every entry of ``nav``, sections' entries included."""
    found = []
    for entry in nav:
        found.append(entry)
        if isinstance(entry, dict):
            for value in entry.values():
                if isinstance(value, list):
                    found += _walk(value)
    return found


def on_pre_build(config: MkDocsConfig) -> None:
    page = _root(config) / config.docs_dir / "hooks.md"
    if page.read_text() != reference.render():
        raise PluginError("docs/hooks.md is stale: run python -m pax_core.plugins.reference "
                          "docs/hooks.md")


def on_files(files: Files, config: MkDocsConfig) -> Files:
    root = _root(config)
    host = PluginHost(PluginSelection.from_env(strict=True))
    try:
        cli = cli_reference.render(host, api_reference.testing_modules(root))
    except cli_reference.MissingCommand as e:
        raise PluginError(str(e)) from None
    pages = {"reference/cli.md": cli}
    for package in api_reference.packages(root):
        pages[package.page] = api_reference.render(package)
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    if page.file.src_uri != "tests.md":
        return markdown
    if markdown.count(_MARKER) != 1:
        raise PluginError(f"docs/tests.md needs one {_MARKER} marker for README.md's section")
    return markdown.replace(_MARKER, readme_tests((_root(config) / "README.md").read_text()))
