"""The documentation's measured tables are what the committed results in bench/results/ generate
(bench/doc_tables.py), so that no figure a page quotes is typed by hand or outlives the
measurement it came from."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "doc_tables.py"
BLOCK = re.compile(r"<!-- bench:([\w-]+) -->\n(.*?)<!-- /bench:\1 -->", re.DOTALL)
# Where each table lives.
HOMES = {"pipeline_speed": "docs/parallelism.md", "train_speed": "docs/speed.md",
         "sweep_trials": "docs/sweeps.md"}


def tables(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=ROOT)


def _copies(tmp_path: Path) -> list[str]:
    """``--page`` arguments for copies of README.md and docs/*.md in ``tmp_path``."""
    args = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        copy = tmp_path / page.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(page.read_text())
        args += ["--page", str(copy)]
    return args


def test_the_tables_are_what_the_committed_results_generate():
    done = tables("--check")
    assert done.returncode == 0, done.stderr + done.stdout
    for name, page in HOMES.items():
        assert name in [m.group(1) for m in BLOCK.finditer((ROOT / page).read_text())], page


def _changed_figure(text: str, name: str) -> str:
    """``text`` with one digit of block ``name``'s table changed."""
    block = next(m for m in BLOCK.finditer(text) if m.group(1) == name)
    table = block.start(2) + block.group(2).index("\n|")
    digit = next(i for i in range(table, block.end(2)) if text[i].isdigit())
    return text[:digit] + str((int(text[digit]) + 1) % 10) + text[digit + 1:]


def test_a_figure_edited_by_hand_is_found_and_generated_again(tmp_path):
    pages = _copies(tmp_path)
    for name, home in HOMES.items():
        page = tmp_path / home
        original = page.read_text()
        page.write_text(_changed_figure(original, name))
        done = tables("--check", *pages)
        assert done.returncode == 1
        assert f"{page}: blocks {name} differ" in done.stderr
        assert tables(*pages).returncode == 0
        assert page.read_text() == original


def test_missing_results_and_markers_are_one_line_and_exit_2(tmp_path):
    empty = tmp_path / "results"
    empty.mkdir()
    done = tables("--check", "--results", str(empty))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "is missing; run python bench/" in done.stderr

    pages = _copies(tmp_path / "pages")
    speed = tmp_path / "pages" / "docs" / "speed.md"
    text = speed.read_text()
    speed.write_text(text.replace("<!-- /bench:train_speed -->", ""))
    done = tables(*pages)
    assert done.returncode == 2 and "'<!-- bench:train_speed -->'" in done.stderr
    assert speed.read_text() == text.replace("<!-- /bench:train_speed -->", "")  # untouched

    speed.write_text(text + "\n<!-- bench:no_such_table -->\n<!-- /bench:no_such_table -->\n")
    done = tables("--check", *pages)
    assert done.returncode == 2 and "no_such_table" in done.stderr
    assert done.stderr.count("\n") == 1

    speed.write_text(text)  # a block on two pages
    readme = tmp_path / "pages" / "README.md"
    block = next(m.group(0) for m in BLOCK.finditer(text) if m.group(1) == "train_speed")
    readme.write_text(readme.read_text() + "\n" + block + "\n")
    done = tables("--check", *pages)
    assert done.returncode == 2 and "it has" not in done.stderr and "2 opening" in done.stderr
