"""Finding the experiment a user named.

Accepted, in this order: ``module.path:Class`` or ``path/to/file.py:Class`` (a user's own class,
no plugin needed); a registered name or ``plugin/name``; a full dotted path (the class's own or a
registered alias such as Pax's ``tasks.lm.params.lm_cloud.LmCloudSpmd2B``); any dotted suffix of
those that only one experiment has. An unknown name lists the closest matches.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import sys
from pathlib import Path

from pax_core.config.experiment import Experiment
from pax_core.errors import RunError, UsageError
from pax_core.plugins.records import Registered, Registry


def _dotted_names(entry: Registered) -> list[str]:
    """Every full dotted name an experiment answers to."""
    component = entry.component
    names = [component.target.replace(":", ".")]
    names += list(getattr(component, "aliases", ()))
    return names


def _is_suffix(query: str, full: str) -> bool:
    return full == query or full.endswith("." + query)


def _load_file(path: Path, attr: str):
    if not path.is_file():
        raise UsageError(f"--exp: no such file {path}")
    module_name = f"pax_user_experiments.{path.stem}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]  # as a failed import leaves no module behind
        raise
    return module, attr


def _stopped_import(error: BaseException) -> str:
    """What a module did that ended its import without an ``Exception``: ``sys.exit()`` (a
    script's ``main`` run at import), or another ``BaseException``. Either would otherwise end
    ``pax`` silently, with the module's exit status."""
    if isinstance(error, SystemExit):
        return f"it exited while being imported (sys.exit({error.code!r}))"
    return f"it raised {type(error).__name__} while being imported"


def load_class(target: str) -> type:
    """Import ``module:Class`` or ``file.py:Class`` and check that it is an experiment."""
    where, _, attr = target.rpartition(":")
    if not where or not attr:
        raise UsageError(f"--exp {target}: expected module:Class or path/to/file.py:Class")
    try:
        if where.endswith(".py"):
            module, attr = _load_file(Path(where), attr)
        else:
            module = importlib.import_module(where)
    except (UsageError, KeyboardInterrupt):
        raise
    except Exception as e:
        raise UsageError(f"--exp {target}: importing {where} failed: "
                         f"{type(e).__name__}: {e}".splitlines()[0]) from e
    except BaseException as e:
        raise UsageError(f"--exp {target}: importing {where} failed: "
                         f"{_stopped_import(e)}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise UsageError(f"--exp {target}: {where} has no attribute {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, Experiment)):
        raise UsageError(f"--exp {target}: {attr} is not a pax_core.Experiment class")
    return cls


def find_registered(registry: Registry, query: str, plugin: str | None = None) -> Registered | None:
    """The registered experiment ``query`` names, or None for a ``module:Class`` target."""
    if ":" in query:
        return None
    pool = [e for e in registry if plugin is None or e.plugin == plugin]
    if "/" in query or any(e.name == query for e in pool):
        return registry.get(query, plugin)
    matches = [e for e in pool if any(_is_suffix(query, n) for n in _dotted_names(e))]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        names = ", ".join(sorted(e.qualified_name for e in matches))
        raise UsageError(f"experiment '{query}' is ambiguous: {names}; give more of its path")
    raise UsageError(_unknown(query, pool, plugin))


def _unknown(query: str, pool: list[Registered], plugin: str | None) -> str:
    where = f" in plugin '{plugin}'" if plugin else ""
    if not pool:
        return f"unknown experiment '{query}'{where}: no experiments are registered{where}"
    short = query.rsplit(".", 1)[-1]
    close = difflib.get_close_matches(short, sorted({e.name for e in pool}), n=5, cutoff=0.5)
    hint = f"; closest: {', '.join(close)}" if close else "; see `pax experiments`"
    return f"unknown experiment '{query}'{where}{hint}"


def _canonical_name(registry: Registry, query: str, cls: type) -> str:
    """One name per class, whatever the spelling: the registered name if the class is
    registered, else ``module:Class``, or ``/absolute/file.py:Class`` for a file."""
    target = f"{cls.__module__}:{cls.__qualname__}"
    for entry in registry:
        if entry.component.target == target:
            return entry.qualified_name
    where, _, attr = query.rpartition(":")
    if where.endswith(".py"):
        return f"{Path(where).resolve()}:{attr}"
    return target


def find_experiment(registry: Registry, query: str, plugin: str | None = None
                    ) -> tuple[str, type]:
    """``(name to record, experiment class)`` for what the user typed after ``--exp``."""
    entry = find_registered(registry, query, plugin)
    if entry is None:
        cls = load_class(query)
        return _canonical_name(registry, query, cls), cls
    try:
        cls = entry.load()
    except (Exception, KeyboardInterrupt):  # an Exception is told by ``load``, naming the plugin
        raise
    except BaseException as e:
        raise RunError(f"experiment '{entry.qualified_name}' could not be loaded from "
                       f"{entry.component.target}: {_stopped_import(e)}") from None
    if not (isinstance(cls, type) and issubclass(cls, Experiment)):
        raise UsageError(f"experiment '{entry.qualified_name}' ({entry.component.target}) is not "
                         f"a pax_core.Experiment class")
    return entry.qualified_name, cls
