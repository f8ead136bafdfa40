"""Typed registration records and the registry that resolves them by name.

A plugin registers a component as a name plus a *lazy* factory: a ``"module:attr"`` string that is
imported only when the component is used, so that listing plugins never imports JAX or a model
library. Every component also carries the plugin that registered it, which is how errors are
attributed and how a user can name ``plugin/name`` when two plugins use the same short name.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Callable, Iterable
from typing import Any

from pax_core.errors import PaxError, RunError, UsageError

KINDS = (
    "models",
    "partitioners",
    "inputs",
    "checkpointers",
    "loggers",
    "experiments",
    "backends",
    "mesh_layouts",
    "commands",
    "trial_runners",
    "weight_formats",
    "harnesses",
)


@dataclasses.dataclass(frozen=True)
class Component:
    """One registered thing: its name, a factory and a line of help.

    ``factory`` is either a ``"package.module:attribute"`` string (preferred: nothing is imported
    until the component is used) or the object itself.
    """

    name: str
    factory: str | Callable[..., Any]
    help: str = ""

    def load(self) -> Any:
        """Import and return the factory object."""
        if not isinstance(self.factory, str):
            return self.factory
        module_name, _, attr = self.factory.partition(":")
        module = importlib.import_module(module_name)
        obj: Any = module
        for part in attr.split(".") if attr else ():
            obj = getattr(obj, part)
        return obj

    @property
    def target(self) -> str:
        """The factory as ``module:attribute`` text, for listings."""
        if isinstance(self.factory, str):
            return self.factory
        return f"{self.factory.__module__}:{self.factory.__qualname__}"


@dataclasses.dataclass(frozen=True)
class ExperimentRef(Component):
    """An experiment class, with the other names it answers to.

    ``aliases`` are full dotted names users already type, such as Pax's
    ``tasks.lm.params.lm_cloud.LmCloudSpmd2B`` or a class's old name; look-up also accepts any
    unique dotted suffix of the factory path or of an alias.
    """

    aliases: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Registered:
    """A component together with where it came from."""

    kind: str
    plugin: str
    component: Component
    distribution: str = "built in"

    @property
    def name(self) -> str:
        return self.component.name

    @property
    def qualified_name(self) -> str:
        return f"{self.plugin}/{self.component.name}"

    def load(self) -> Any:
        """Import the factory; an import failure is reported against the plugin."""
        try:
            return self.component.load()
        except Exception as e:
            raise RunError(
                f"{self.kind[:-1]} '{self.qualified_name}' could not be loaded from "
                f"{self.component.target}: {type(e).__name__}: {e}"
            ) from e

    def build(self, *args: Any, **kwargs: Any) -> Any:
        """Load the factory and call it; a failure stops the run with the plugin named (a
        ``PaxError`` the factory raises, such as a ``UsageError`` naming a setting to make, is
        its own message and passes as it is)."""
        factory = self.load()
        try:
            return factory(*args, **kwargs)
        except PaxError:
            raise
        except Exception as e:
            raise RunError(
                f"{self.kind[:-1]} '{self.qualified_name}' (plugin '{self.plugin}') failed: "
                f"{type(e).__name__}: {e}"
            ) from e


class Registry:
    """All components of one kind, addressable as ``name`` or ``plugin/name``.

    Built-in components belong to plugin ``core``. A plugin's component wins the short name over a
    built-in of the same name, so that adding a built-in later never changes what an existing
    command line means (the built-in stays reachable as ``core/name``). Two plugins registering one
    name make the short name an error that names both distributions: never a silent last-wins.
    """

    def __init__(self, kind: str, entries: Iterable[Registered] = ()):
        self.kind = kind
        self.entries: list[Registered] = list(entries)

    def __iter__(self):
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def names(self) -> list[str]:
        return [e.qualified_name for e in self.entries]

    def get(self, name: str, plugin: str | None = None) -> Registered:
        """Resolve ``name`` (or ``plugin/name``), optionally restricted to one plugin."""
        if "/" in name:
            named, _, name = name.partition("/")
            if plugin is not None and named != plugin:
                raise UsageError(f"{self.kind[:-1]} '{named}/{name}' is not from plugin '{plugin}'")
            plugin = named
        matches = [
            e for e in self.entries if e.name == name and (plugin is None or e.plugin == plugin)
        ]
        if len(matches) > 1:
            matches = [e for e in matches if e.plugin != "core"] or matches
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            both = " and ".join(f"'{e.qualified_name}' from {e.distribution}" for e in matches)
            raise UsageError(
                f"the {self.kind[:-1]} '{name}' is registered twice: {both}; "
                f"name the one you mean as plugin/{name}, or disable a plugin"
            )
        raise UsageError(self._unknown_message(name, plugin))

    def conflicts(self) -> dict[str, list[Registered]]:
        """Short names that two or more non-core plugins registered."""
        by_name: dict[str, list[Registered]] = {}
        for e in self.entries:
            if e.plugin != "core":
                by_name.setdefault(e.name, []).append(e)
        return {n: es for n, es in by_name.items() if len(es) > 1}

    def _unknown_message(self, name: str, plugin: str | None) -> str:
        pool = [e for e in self.entries if plugin is None or e.plugin == plugin]
        where = f" in plugin '{plugin}'" if plugin else ""
        close = difflib.get_close_matches(name, sorted({e.name for e in pool}), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        if not pool:
            hint = f"; no {self.kind} are registered{where}"
        return f"unknown {self.kind[:-1]} '{name}'{where}{hint}"

