"""``pax plugins new``: a complete, working plugin package written from templates.

The templates ship inside the pax-core wheel (``pax_core/plugins/templates``): ``modality`` is
every plugin's base (pyproject with the entry point and API range, ``plugin.py``, a model, an
input, an experiment that trains in seconds, tests, README) and ``backend`` adds a backend.
File names and contents carry ``{{placeholders}}`` (``__module__`` and ``__name__`` in paths);
the package is written into a temporary folder and renamed into place, so a failure leaves
nothing behind.
"""

from __future__ import annotations

import importlib.resources
import keyword
import os
import re
import shutil
import tempfile
from pathlib import Path

from pax_core import API_VERSION, __version__
from pax_core.errors import UsageError

NAME = re.compile(r"[a-z][a-z0-9_]*")
FLAVOURS = ("modality", "backend")

_BACKEND_HOOK = '''

@hookimpl
def pax_register_backends():
    return [Component("cpu", "{{module}}.backends:{{Class}}Backend",
                      "the host CPU with {{name}}'s settings")]'''
_BACKEND_ROW = ("| `src/{{module}}/backends.py` | the backend: the CPU with this plugin's "
                "settings, registered for `cpu` |\n")


def _next(version: str) -> str:
    """The first version a semantic range built on ``version`` excludes."""
    major, minor = (int(p) for p in version.split(".")[:2])
    return f"0.{minor + 1}" if major == 0 else f"{major + 1}"


def substitutions(name: str, backend: bool) -> dict[str, str]:
    api_major, api_minor = API_VERSION.split(".")[:2]
    values = {
        "name": name,
        "NAME": name.upper(),
        "module": f"pax_{name}",
        "distribution": f"pax-{name.replace('_', '-')}",
        "Class": "".join(part.capitalize() for part in name.split("_")),
        "Title": name.replace("_", " ").capitalize(),
        "api_range": f">={api_major}.{api_minor},<{int(api_major) + 1}",
        "pax_core_version": __version__,
        "pax_core_next": _next(__version__),
        "backend_hook": _BACKEND_HOOK if backend else "",
        "backend_row": _BACKEND_ROW if backend else "",
    }
    return values


def _fill(text: str, values: dict[str, str]) -> str:
    for _ in range(2):  # the backend snippets carry placeholders of their own
        text = re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], text)
    return text


def check_name(name: str) -> None:
    if not NAME.fullmatch(name) or keyword.iskeyword(name) or name == "core":
        raise UsageError(f"plugin name {name!r}: use lower-case letters, digits and _, starting "
                         f"with a letter (for example 'speech' or 'my_task'); 'core' is taken")


def new_plugin(name: str, output: Path, backend: bool = False) -> list[Path]:
    """Write the package for plugin ``name`` into ``output`` (which must not exist, or be an
    empty folder); returns the files written, relative to ``output``."""
    check_name(name)
    output = output.expanduser().resolve()
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise UsageError(f"--output {output} exists and is not empty; choose another folder "
                         f"(nothing was written)")
    values = substitutions(name, backend)
    templates = importlib.resources.files("pax_core.plugins") / "templates"
    flavours = ["modality", "backend"] if backend else ["modality"]
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", dir=output.parent))
    written: list[Path] = []
    try:
        for flavour in flavours:
            with importlib.resources.as_file(templates / flavour) as root:
                for source in sorted(Path(root).rglob("*.tmpl")):
                    relative = source.relative_to(root).with_suffix("")
                    relative = Path(str(relative).replace("__module__", values["module"])
                                    .replace("__name__", name))
                    target = staging / relative
                    target.parent.mkdir(parents=True, exist_ok=True)
                    text = _fill(source.read_text(), values).rstrip() + "\n"
                    target.write_text(text)
                    written.append(relative)
        if output.exists():
            output.rmdir()
        os.replace(staging, output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sorted(written)
