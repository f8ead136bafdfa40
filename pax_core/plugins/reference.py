"""``docs/hooks.md``: the hook reference, rendered from ``pax_core.plugins.hookspecs``.

The docstrings are the reference; this module turns them into Markdown so that the page cannot
drift from the code (a test compares them). Regenerate with::

    python -m pax_core.plugins.reference docs/hooks.md
"""

from __future__ import annotations

import inspect
import re
import sys
from pathlib import Path

from pax_core import API_VERSION
from pax_core.plugins import hookspecs

# ``module.path:attr`` in a docstring: a factory or class that must import.
TARGET = re.compile(r"[\"`]((?!module:)[a-z_][\w.]*:[A-Za-z_][\w.]*)[\"`]")
# ``pax_core.Name``: a public name that must exist.
PUBLIC = re.compile(r"``pax_core\.([A-Za-z_]\w*)``")


def hook_names() -> list[str]:
    """Every hook, in the order the module declares them."""
    return [name for name, fn in vars(hookspecs).items()
            if name.startswith("pax_") and callable(fn) and hasattr(fn, "pax_spec")]


def _literals(line: str) -> str:
    return re.sub(r"``([^`]+)``", r"`\1`", line)


def _markdown(doc: str) -> str:
    """reStructuredText-ish docstring -> Markdown: literals, and ``::`` blocks fenced."""
    out: list[str] = []
    lines = doc.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        i += 1
        if not line.endswith("::"):
            out.append(_literals(line))
            continue
        out += [_literals(line[:-2].rstrip() + ":") if line != "::" else "", ""]
        block: list[str] = []
        while i < len(lines) and (not lines[i].strip() or lines[i].startswith("    ")):
            block.append(lines[i][4:])
            i += 1
        while block and not block[0].strip():
            block.pop(0)
        while block and not block[-1].strip():
            block.pop()
        out += ["```python", *block, "```", ""]
    return "\n".join(out).strip()


def render() -> str:
    """The whole page."""
    parts = [
        "# Pax hooks",
        "",
        f"Plugin API {API_VERSION}. Generated from `pax_core/plugins/hookspecs.py` by "
        "`python -m pax_core.plugins.reference docs/hooks.md`; edit the docstrings, not this "
        "page.",
        "",
        _markdown(inspect.getdoc(hookspecs) or ""),
    ]
    for name in hook_names():
        fn = getattr(hookspecs, name)
        signature = str(inspect.signature(fn)).replace("'", "")
        parts += ["", f"## `{name}{signature}`", "", _markdown(inspect.getdoc(fn) or "")]
    return "\n".join(parts) + "\n"


def documented_text() -> str:
    """The raw docstrings, for checking the names they cite."""
    return "\n".join([inspect.getdoc(hookspecs) or ""] +
                     [inspect.getdoc(getattr(hookspecs, n)) or "" for n in hook_names()])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m pax_core.plugins.reference PATH", file=sys.stderr)
        return 2
    Path(args[0]).write_text(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
