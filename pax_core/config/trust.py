"""What a job directory may make Pax import.

A job directory is data, and people pass them around: ``runs.jsonl`` names the experiment a
run trained and ``config.json`` names every class and function of its config, which Fiddle
imports (and calls, when it builds). A command that reads a job on its own (``pax eval``,
``pax export``, ``pax decode`` without ``--exp``) therefore follows those names only to
installed, registered code: an experiment a plugin registers, and in a config, the modules of
pax-core and of the active plugins, the containers of Fiddle and Python, and NumPy's scalar
types (dtypes). Anything else (a ``file.py:Class``, ``os.system``, a module that is merely
installed) is refused before it is imported, naming what the job asked for; a user who trusts
the job says so by naming the experiment with ``--exp``.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from typing import Any

from pax_core.config import lookup
from pax_core.errors import UsageError
from pax_core.plugins.host import PluginHost

# Python's and Fiddle's containers, which a serialized config is made of; nothing callable
# beyond building the container itself.
_CONTAINERS = {
    "builtins": {"tuple", "list", "dict", "set", "frozenset"},
    "fiddle._src.config": {"Config", "Partial", "BuildableTraverserMetadata"},
}
_DTYPE_LIBRARIES = {"numpy", "jax", "ml_dtypes"}


def _references(node: Any) -> Iterator[tuple[str, str]]:
    """Every ``(module, name)`` a Fiddle JSON document refers to."""
    if isinstance(node, dict):
        if node.get("type") == "pyref":
            yield str(node.get("module")), str(node.get("name"))
        for value in node.values():
            yield from _references(value)
    elif isinstance(node, list):
        for value in node:
            yield from _references(value)


def _registered_packages(host: PluginHost) -> set[str]:
    """The top-level packages of pax-core and of every active plugin."""
    packages = {"pax_core"}
    for record in host.records.values():
        if record.status == "active":
            packages.add(record.module.split(":")[0].split(".")[0])
    return packages


def _is_dtype(module: str, name: str) -> bool:
    """Whether ``module.name`` is a NumPy scalar type (``float32``, ``bfloat16``), importing
    only the installed numerical libraries."""
    if module.split(".")[0] not in _DTYPE_LIBRARIES:
        return False
    import numpy as np

    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return False
    return isinstance(found, type) and issubclass(found, np.generic)


def check_config(host: PluginHost, text: str, where: str) -> None:
    """Refuse a job's Fiddle JSON config that names code other than installed, registered
    code, before Fiddle imports any of it."""
    try:
        document = json.loads(text)
    except ValueError:
        return  # not JSON: loading it reports that, importing nothing
    packages = _registered_packages(host)
    for module, name in _references(document):
        if (name in _CONTAINERS.get(module, ()) or module.split(".")[0] in packages
                or _is_dtype(module, name)):
            continue
        raise UsageError(f"{where} names {module}.{name}, which is not code of pax-core or of "
                         f"an installed plugin; reading a job imports only that. If you trust "
                         f"this job, pass --exp with its experiment (exp= from Python; its "
                         f"config.json is then not read)")


def check_recorded_experiment(host: PluginHost, name: str, where: str) -> None:
    """Refuse an experiment recorded in a job that is not a registered one (a
    ``module:Class`` or ``file.py:Class`` would be imported from wherever it points)."""
    if lookup.find_registered(host.components("experiments"), name) is None:
        raise UsageError(f"{where} names experiment {name}, which is not registered by an "
                         f"installed plugin; reading a job imports only registered code. If "
                         f"you trust it, pass --exp {name} (exp={name!r} from Python)")
