"""Every catalogue experiment's resolved configuration, against the committed record.

A refactoring of the experiments (their skeleton, their constants, where their classes live)
must leave what each one trains unchanged. The record holds, for every registered experiment,
its mesh and components and every leaf of its config tree, defaults included, with each
configured callable named by its qualified name (so moving a class between modules is not a
change, swapping it is). A deliberate change is made by rewriting the record in the same
commit, where the diff shows exactly what changed (``python tests/test_catalogue_configs.py``,
on the 8 CPU devices the tests use, as Pax's global batch counts the devices).
"""

from __future__ import annotations

import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

import fiddle as fdl

RECORD = Path(__file__).parent / "data" / "catalogue_configs.json"
# Constants that reach the run outside the config tree.
RUNTIME_CONSTANTS = ("ICI_MESH_SHAPE", "DCN_MESH_SHAPE", "MESH_AXIS_NAMES", "LOGICAL_AXIS_RULES",
                     "PARTITIONER", "MESH_LAYOUT", "CHECKPOINTER", "LOGGERS", "REQUIRED_PLUGINS")
# A flax module's bookkeeping, not configuration.
SKIPPED = {"parent", "name"}


def _leaves(value: Any, path: str, out: dict[str, str]) -> None:
    if isinstance(value, fdl.Buildable):
        target = fdl.get_callable(value)
        out[f"{path}:"] = getattr(target, "__qualname__", repr(target))
        try:
            parameters = inspect.signature(target).parameters
        except (TypeError, ValueError):
            parameters = {}
        names = [n for n, p in parameters.items()
                 if n not in SKIPPED and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        names += [n for n in value.__arguments__ if n not in names]
        for name in names:
            default = parameters[name].default if name in parameters else inspect.Parameter.empty
            given = value.__arguments__.get(name, default)
            _leaves("<required>" if given is inspect.Parameter.empty else given,
                    f"{path}.{name}", out)
    elif isinstance(value, (list, tuple)):
        out[f"{path}:"] = f"{type(value).__name__}[{len(value)}]"
        for i, item in enumerate(value):
            _leaves(item, f"{path}[{i}]", out)
    elif isinstance(value, dict):
        out[f"{path}:"] = f"dict[{len(value)}]"
        for key in sorted(value, key=str):
            _leaves(value[key], f"{path}[{key!r}]", out)
    elif callable(value) and hasattr(value, "__qualname__"):
        out[path] = value.__qualname__
    else:
        out[path] = repr(value)


def resolved_catalogue() -> dict[str, dict[str, Any]]:
    """Every registered experiment: its runtime constants and its config's leaves."""
    from pax_core.config import resolve
    from pax_core.plugins.host import PluginHost, PluginSelection

    host = PluginHost(PluginSelection.from_env())
    catalogue: dict[str, dict[str, Any]] = {}
    for entry in sorted(host.components("experiments"), key=lambda e: (e.plugin, e.name)):
        key = f"{entry.plugin}:{entry.name}"
        try:
            resolved = resolve.resolve(host, entry.name, entry.plugin, [])
        except Exception as e:  # recorded: an experiment that cannot resolve here must stay so
            catalogue[key] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
            continue
        constants = resolved.experiment.constants()
        leaves: dict[str, str] = {}
        _leaves(resolved.config, "job", leaves)
        catalogue[key] = {"runtime": {n: repr(constants.get(n)) for n in RUNTIME_CONSTANTS},
                          "config": leaves}
    return catalogue


def _differences(recorded: dict[str, Any], now: dict[str, Any]) -> list[str]:
    lines = [f"{name}: no longer registered" for name in recorded if name not in now]
    lines += [f"{name}: newly registered (rewrite the record)" for name in now
              if name not in recorded]
    for name in sorted(recorded.keys() & now.keys()):
        before, after = recorded[name], now[name]
        if "error" in before or "error" in after:
            if before != after:
                lines.append(f"{name}: {before.get('error', 'resolved')} -> "
                             f"{after.get('error', 'resolved')}")
            continue
        for part in ("runtime", "config"):
            for path in sorted(before[part].keys() | after[part].keys()):
                old, new = before[part].get(path, "<absent>"), after[part].get(path, "<absent>")
                if old != new:
                    lines.append(f"{name}: {path}: {old} -> {new}")
    return lines


def test_every_catalogue_experiment_resolves_as_recorded():
    recorded = json.loads(RECORD.read_text())
    differences = _differences(recorded, resolved_catalogue())
    assert not differences, (f"{len(differences)} differences from {RECORD.name} (a deliberate "
                             f"change rewrites it: see this module's docstring):\n"
                             + "\n".join(differences[:60]))


if __name__ == "__main__":
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    os.environ["JAX_PLATFORMS"] = "cpu"
    RECORD.parent.mkdir(exist_ok=True)
    RECORD.write_text(json.dumps(resolved_catalogue(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {RECORD}", file=sys.stderr)
