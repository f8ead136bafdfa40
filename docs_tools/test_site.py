"""The built site as a reader's browser shows it: every page of the navigation, served over HTTP
on 127.0.0.1 and opened in a headless Chromium (Debian's ``chromium``), has run the theme's
scripts, shows its title, its content and the whole navigation with itself marked; the
references hold every command and every public name; and three pages are photographed for a
person to look at (``PAX_SCREENSHOTS``, default a temporary folder).

Run after ``mkdocs build`` (``python3 -m nox -s docs`` does both); ``PAX_SITE_DIR`` names the
built site (default ``site``). Without Chromium the test fails and says what to install.
"""

from __future__ import annotations

import functools
import html
import http.server
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
import api_reference  # noqa: E402 (docs_tools is a folder of scripts, not a package)

SITE = Path(os.environ.get("PAX_SITE_DIR", ROOT / "site"))
SCREENSHOTS = ("", "quickstart-lm/", "reference/cli/")
WINDOW = (1280, 1000)
_TAGS = re.compile(r"<[^>]+>")


def _nav_pages(nav: list) -> Iterator[tuple[str, str]]:
    """(title, page) of every page in mkdocs.yml's navigation, in order, with the API section
    the build fills in (docs_tools/site_hooks.py)."""
    for item in nav:
        ((title, target),) = item.items()
        if title == "API":
            target = api_reference.nav(ROOT)
        if isinstance(target, list):
            yield from _nav_pages(target)
        else:
            yield title, target


PAGES = list(_nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))


def _url_path(page: str) -> str:
    """The path MkDocs serves ``page`` at, with directory URLs."""
    return "" if page == "index.md" else page.removesuffix(".md") + "/"


def _text(fragment: str) -> str:
    return " ".join(html.unescape(_TAGS.sub(" ", fragment)).split())


@pytest.fixture(scope="session")
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("the site is checked in a headless Chromium, and none is installed: "
                    "apt-get install -y chromium (Debian's package; python3 -m nox -s docs "
                    "installs it when run as root)", pytrace=False)
    return found


@pytest.fixture(scope="session")
def site() -> Iterator[str]:
    """The built site served over HTTP on 127.0.0.1 (a free port); its base URL."""
    if not (SITE / "index.html").exists():
        pytest.fail(f"no built site in {SITE}: run mkdocs build --strict first (python3 -m nox "
                    f"-s docs builds and checks it)", pytrace=False)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(SITE)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def _chromium(browser: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """One headless Chromium run with a profile of its own (they run side by side)."""
    profile = tmp / f"profile-{threading.get_ident()}-{len(list(tmp.iterdir()))}"
    return subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--hide-scrollbars", f"--user-data-dir={profile}", "--virtual-time-budget=5000",
         *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="session")
def doms(chromium, site, tmp_path_factory) -> dict[str, str]:
    """Each navigation page's DOM after the browser ran its scripts (``--dump-dom``)."""
    tmp = tmp_path_factory.mktemp("chromium")

    def dump(page: str) -> tuple[str, str]:
        done = _chromium(chromium, tmp, "--dump-dom", site + _url_path(page))
        assert done.returncode == 0, f"chromium failed on {page}: {done.stderr[-2000:]}"
        return page, done.stdout

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(dump, [page for _, page in PAGES]))


@pytest.mark.parametrize(("title", "page"), PAGES, ids=[page for _, page in PAGES])
def test_every_page_renders_with_its_navigation(doms, title, page):
    dom = doms[page]
    opening = re.search(r"<html[^>]*class=\"([^\"]*)\"", dom)
    classes = opening.group(1).split() if opening else []
    assert "js" in classes and "no-js" not in classes, (
        f"{page}: the theme's scripts did not run (<html class={classes}>)")
    content = re.search(r'<article class="md-content__inner[^"]*">(.*?)</article>', dom, re.S)
    assert content, f"{page}: no article"
    heading = re.search(r"<h1[^>]*>(.*?)</h1>", content.group(1), re.S)
    assert heading and _text(heading.group(1)), f"{page}: no title"
    assert len(_text(content.group(1))) > 200, f"{page}: hardly any content"
    assert 'class="md-nav md-nav--primary"' in dom, f"{page}: no navigation"
    nav = dom.split('class="md-nav md-nav--primary"', 1)[1].split("md-sidebar--secondary", 1)[0]
    shown = _text(nav)
    missing = [t for t, _ in PAGES if t not in shown]
    assert not missing, f"{page}: the navigation lacks {missing}"
    active = re.findall(r'<a href="[^"]*" class="md-nav__link md-nav__link--active">(.*?)</a>',
                        nav, re.S)
    assert [_text(a) for a in active] == [title], f"{page}: marked as current: {active}"


def _headings(dom: str, level: int) -> list[str]:
    return [_text(h) for h in re.findall(rf"<h{level}[^>]*>(.*?)</h{level}>", dom, re.S)]


def test_the_command_reference_holds_every_command_pax_help_lists(doms):
    """Against the installed ``pax`` itself: each command ``pax --help`` lists is a section."""
    shown = subprocess.run(["pax", "--help"], capture_output=True, text=True, check=True,
                           env={**os.environ, "COLUMNS": "200"}).stdout
    listed = shown.split("Commands:", 1)[1]
    commands = re.findall(r"^  (\S+)\s", listed, re.M)
    assert {"train", "eval", "plugins", "decode", "sweep"} <= set(commands)
    sections = {h.removesuffix("¶").strip() for h in _headings(doms["reference/cli.md"], 2)}
    missing = [c for c in commands if f"pax {c}" not in sections]
    assert not missing, f"the command-line reference lacks {missing}"


@pytest.mark.parametrize("package", api_reference.packages(ROOT), ids=lambda p: p.module)
def test_every_public_name_has_its_entry(doms, package):
    _, face = api_reference.public_face(package)
    shown = {h.split("(")[0].removesuffix("¶").split()[0]
             for h in _headings(doms[package.page], 2) if h}
    missing = sorted(f"{package.module}.{n}" for n in face if f"{package.module}.{n}" not in shown)
    assert not missing, f"{package.page} lacks {missing}"


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.mark.parametrize("url_path", SCREENSHOTS)
def test_screenshots_for_a_person_to_look_at(chromium, site, url_path, tmp_path):
    folder = Path(os.environ.get("PAX_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    shot = folder / f"{url_path.strip('/').replace('/', '-') or 'index'}.png"
    done = _chromium(chromium, tmp_path, f"--screenshot={shot}",
                     f"--window-size={WINDOW[0]},{WINDOW[1]}", site + url_path)
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    assert _png_size(shot) == WINDOW
    # A page of text, navigation and tables compresses far less than a blank one (~5 KB).
    assert shot.stat().st_size > 40_000, f"{shot} looks blank"
