"""The README's measured tables are what the committed results in bench/results/ generate
(bench/readme_tables.py), so that no figure the README quotes is typed by hand or outlives the
measurement it came from."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "readme_tables.py"
README = ROOT / "README.md"
BLOCK = re.compile(r"<!-- bench:([\w-]+) -->\n(.*?)<!-- /bench:\1 -->", re.DOTALL)


def tables(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=ROOT)


def test_the_readme_tables_are_what_the_committed_results_generate():
    done = tables("--check")
    assert done.returncode == 0, done.stderr + done.stdout
    names = [m.group(1) for m in BLOCK.finditer(README.read_text())]
    assert {"pipeline_speed", "train_speed", "sweep_trials"} <= set(names)


def _changed_figure(text: str, name: str) -> str:
    """``text`` with one digit of block ``name``'s table changed."""
    block = next(m for m in BLOCK.finditer(text) if m.group(1) == name)
    table = block.start(2) + block.group(2).index("\n|")
    digit = next(i for i in range(table, block.end(2)) if text[i].isdigit())
    return text[:digit] + str((int(text[digit]) + 1) % 10) + text[digit + 1:]


def test_a_figure_edited_by_hand_is_found_and_generated_again(tmp_path):
    readme = tmp_path / "README.md"
    original = README.read_text()
    for name in ("pipeline_speed", "train_speed", "sweep_trials"):
        readme.write_text(_changed_figure(original, name))
        done = tables("--check", "--readme", str(readme))
        assert done.returncode == 1
        assert f"blocks {name} differ" in done.stderr
        assert tables("--readme", str(readme)).returncode == 0
        assert readme.read_text() == original


def test_missing_results_and_markers_are_one_line_and_exit_2(tmp_path):
    empty = tmp_path / "results"
    empty.mkdir()
    done = tables("--check", "--results", str(empty))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "is missing; run python bench/" in done.stderr

    readme = tmp_path / "README.md"
    text = README.read_text()
    readme.write_text(text.replace("<!-- /bench:train_speed -->", ""))
    done = tables("--readme", str(readme))
    assert done.returncode == 2 and "'<!-- bench:train_speed -->'" in done.stderr
    assert readme.read_text() == text.replace("<!-- /bench:train_speed -->", "")  # untouched

    readme.write_text(text + "\n<!-- bench:no_such_table -->\n<!-- /bench:no_such_table -->\n")
    done = tables("--check", "--readme", str(readme))
    assert done.returncode == 2 and "no_such_table" in done.stderr
    assert done.stderr.count("\n") == 1
