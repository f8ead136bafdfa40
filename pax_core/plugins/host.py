"""The plugin host: finds plugins, isolates the broken ones, and serves their components.

Plugins are entry points in the ``pax`` group. Each is loaded on its own (pluggy's own loader
stops at the first import error), validated against the hook specs, and asked once for what it
registers. Built-in components are the plugin ``core``.

Environment (each has a command-line switch on ``pax``):

* ``PAX_PLUGINS=a,b`` loads only those plugins (empty: built-ins only); ``--plugins``.
* ``PAX_DISABLE_PLUGINS=a,b`` skips those plugins; ``--disable-plugins``.
* ``PAX_STRICT_PLUGINS=1`` makes any plugin failure fatal instead of a warning.
* ``PAX_TRACE_PLUGINS=1`` prints every hook call, the plugins it reached and its duration.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import os
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import pluggy

from pax_core import API_VERSION, __version__
from pax_core.errors import RunError, UsageError, warn
from pax_core.plugins import hookspecs
from pax_core.plugins.calls import CallTrace, call_one
from pax_core.plugins.records import KINDS, Component, Registered, Registry
from pax_core.plugins.versions import IncompatiblePlugin, check_compatible, declared_range

CORE = "core"


@dataclasses.dataclass
class PluginRecord:
    """What ``pax plugins`` shows for one plugin."""

    name: str
    distribution: str
    version: str
    module: str
    status: str = "active"
    reason: str = ""
    api: str = ""
    hooks: list[str] = dataclasses.field(default_factory=list)
    registered: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    error: BaseException | None = dataclasses.field(default=None, repr=False)

    @property
    def label(self) -> str:
        return f"{self.distribution} {self.version}"

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "module": self.module,
            "status": self.status,
            "reason": self.reason,
            "api": self.api,
            "hooks": self.hooks,
            "registered": self.registered,
        }


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "false", "False")


def _split(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [v.strip() for v in value.split(",") if v.strip()]


@dataclasses.dataclass(frozen=True)
class PluginSelection:
    """Which plugins to load: ``allow`` None means all; an empty list means built-ins only."""

    allow: list[str] | None = None
    disable: tuple[str, ...] = ()
    strict: bool = False

    @classmethod
    def from_env(
        cls, allow: str | None = None, disable: str | None = None, strict: bool | None = None
    ) -> PluginSelection:
        """Command-line values win over the environment."""
        allow_list = _split(allow if allow is not None else os.environ.get("PAX_PLUGINS"))
        if disable is None:
            disable = os.environ.get("PAX_DISABLE_PLUGINS")
        disable_list = _split(disable)
        if strict is None:
            strict = _flag("PAX_STRICT_PLUGINS")
        return cls(allow_list, tuple(disable_list or ()), strict)

    def why_skipped(self, name: str) -> str | None:
        if name in self.disable:
            return "disabled (PAX_DISABLE_PLUGINS / --disable-plugins)"
        if self.allow is not None and name not in self.allow:
            return "not in the allow-list (PAX_PLUGINS / --plugins)"
        return None


def _distribution_of(plugin: Any) -> tuple[str, str | None]:
    """The installed distribution that ships ``plugin``'s package, for plugins registered
    directly rather than through an entry point."""
    module = getattr(plugin, "__name__", None) or type(plugin).__module__
    names = importlib.metadata.packages_distributions().get(module.split(".")[0], [])
    if not names:
        return "unknown distribution", None
    return names[0], importlib.metadata.version(names[0])


def _check_hashable(plugin: object) -> None:
    """pluggy keeps plugins in sets (its subset callers), so a plugin must be hashable."""
    try:
        hash(plugin)
    except TypeError:
        raise TypeError(f"a plugin must be a module or a hashable object, not an unhashable "
                        f"{type(plugin).__name__}") from None


class PluginHost:
    """A pluggy manager plus the components each plugin registered.

    Every entry point is registered first and asked for its records after, so that a hook
    wrapper from any plugin sees every plugin's registration call.
    """

    def __init__(
        self,
        selection: PluginSelection | None = None,
        *,
        entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
    ):
        self.selection = selection or PluginSelection.from_env()
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        if _flag("PAX_TRACE_PLUGINS"):
            CallTrace().install(self.pm)
        self.records: dict[str, PluginRecord] = {}
        self._registered: dict[str, list[Registered]] = {}
        self._registries: dict[str, Registry] = {}
        from pax_core.plugins import builtin

        if entry_points is None:
            entry_points = importlib.metadata.entry_points(group=hookspecs.PROJECT)
        pending = [self._add(builtin, CORE, "pax-core", __version__, "pax_core.plugins.builtin")]
        pending += [self._load_entry_point(ep) for ep in entry_points]
        for record in pending:
            if record is not None:
                self._collect_records(record)
        self._warn_unknown_names()

    def _load_entry_point(self, ep: importlib.metadata.EntryPoint) -> PluginRecord | None:
        dist = ep.dist.name if ep.dist else "unknown distribution"
        version = ep.dist.version if ep.dist else "?"
        if ep.name in self.records:
            first = self.records[ep.name]
            self._fail(
                PluginRecord(ep.name, dist, version, ep.value),
                UsageError(f"plugin name '{ep.name}' is already taken by {first.label}"),
            )
            return None
        skipped = self.selection.why_skipped(ep.name)
        if skipped:
            self.records[ep.name] = PluginRecord(
                ep.name, dist, version, ep.value, status="disabled", reason=skipped
            )
            return None
        try:
            module = ep.load()
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # a plugin calling sys.exit() must not end `pax plugins`
            self._fail(PluginRecord(ep.name, dist, version, ep.value), e)
            return None
        return self._add(module, ep.name, dist, version, ep.value)

    def _warn_unknown_names(self) -> None:
        named = set(self.selection.disable) | set(self.selection.allow or ())
        for name in sorted(named - set(self.records)):
            close = difflib.get_close_matches(name, sorted(self.records), n=1)
            hint = f"; did you mean {close[0]}?" if close else ""
            warn(f"PAX_PLUGINS / PAX_DISABLE_PLUGINS name '{name}', which is not an installed "
                 f"plugin{hint}")

    def register(
        self,
        plugin: ModuleType | object,
        name: str,
        *,
        distribution: str | None = None,
        version: str | None = None,
        source: str | None = None,
    ) -> PluginRecord:
        """Register a plugin object (module or instance) under ``name`` and collect its records.

        A plugin built for another API range is refused (status ``incompatible``); one whose
        hooks do not match the specs, or whose registration hooks raise or return the wrong
        type, is unregistered and marked failed.
        """
        if name in self.records:
            raise UsageError(f"plugin name '{name}' is already taken by {self.records[name].label}")
        if source is None:
            source = getattr(plugin, "__name__", type(plugin).__qualname__)
        if distribution is None:
            distribution, version = _distribution_of(plugin)
        record = self._add(plugin, name, distribution, version, source)
        if record is not None:
            self._collect_records(record)
        return self.records[name]

    def _add(self, plugin: ModuleType | object, name: str, distribution: str,
             version: str | None, source: str) -> PluginRecord | None:
        """Check the plugin's API range and register it with pluggy; None if it was refused."""
        record = PluginRecord(name, distribution, version or "?", source)
        try:
            _check_hashable(plugin)
            record.api = declared_range(plugin)
            check_compatible(record.api)
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except Exception as e:
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            self._fail(record, e)
            return None
        record.hooks = sorted(caller.name for caller in self.pm.get_hookcallers(plugin) or ())
        self.records[name] = record
        return record

    def _collect_records(self, record: PluginRecord) -> None:
        """Ask a registered plugin for its records; a plugin whose hooks fail is unregistered."""
        try:
            collected = self._collect(record.name, record.label)
        except Exception as e:
            self.pm.unregister(name=record.name)
            del self.records[record.name]
            self._fail(record, e)
            return
        self._registered[record.name] = collected
        record.registered = {
            kind: [r.name for r in collected if r.kind == kind]
            for kind in KINDS
            if any(r.kind == kind for r in collected)
        }
        self._registries = {}

    def unregister(self, name: str) -> None:
        """Remove a plugin registered under ``name`` (used by tests)."""
        plugin = self.pm.get_plugin(name)
        if plugin is not None:
            self.pm.unregister(plugin)
        self.records.pop(name, None)
        self._registered.pop(name, None)
        self._registries = {}

    def _collect(self, name: str, label: str) -> list[Registered]:
        out: list[Registered] = []
        for kind in KINDS:
            hook_name = f"pax_register_{kind}"
            hook = getattr(self.pm.hook, hook_name)
            if not any(i.plugin_name == name for i in hook.get_hookimpls()):
                continue
            for result in call_one(self.pm, hook_name, name):
                if not isinstance(result, list | tuple) or not all(
                    isinstance(c, Component) for c in result
                ):
                    raise TypeError(
                        f"pax_register_{kind} must return a list of Component records, "
                        f"got {result!r}"
                    )
                names = [c.name for c in result]
                dupes = sorted({n for n in names if names.count(n) > 1})
                if dupes:
                    raise ValueError(f"pax_register_{kind} returns {dupes[0]!r} twice")
                out.extend(Registered(kind, name, c, label) for c in result)
        return out

    def _fail(self, record: PluginRecord, error: BaseException) -> None:
        record.error = error
        if isinstance(error, IncompatiblePlugin):
            record.status, record.reason = "incompatible", str(error)
            what = "is not loaded"
        else:
            record.status = "failed"
            record.reason = f"{type(error).__name__}: {error}".splitlines()[0]
            what = "failed to load"
        self.records.setdefault(record.name, record)
        message = (
            f"plugin '{record.name}' ({record.label}, entry point {record.module}) "
            f"{what}: {record.reason}"
        )
        if self.selection.strict:
            raise RunError(message + " [PAX_STRICT_PLUGINS is set]") from error
        warn(message)

    def components(self, kind: str) -> Registry:
        """Every active component of ``kind``, in registration order."""
        if kind not in KINDS:
            raise ValueError(f"unknown component kind {kind!r}; kinds are {', '.join(KINDS)}")
        if kind not in self._registries:
            entries = [r for regs in self._registered.values() for r in regs if r.kind == kind]
            self._registries[kind] = Registry(kind, entries)
        return self._registries[kind]

    def require(self, name: str) -> PluginRecord:
        """The plugin a user named explicitly: it must exist and be active."""
        record = self.records.get(name)
        if record is None:
            known = ", ".join(sorted(self.records)) or "none"
            raise UsageError(f"unknown plugin '{name}'; installed plugins: {known}")
        if record.status == "failed":
            message = f"plugin '{name}' ({record.label}) failed to load: {record.reason}"
            raise RunError(message) from record.error
        if record.status == "disabled":
            raise UsageError(f"plugin '{name}' is {record.reason}")
        if record.status == "incompatible":
            raise UsageError(f"plugin '{name}' ({record.label}) is {record.reason}; install a "
                             f"version of it built for pax API {API_VERSION}")
        return record

    def owner_of(self, obj: Any) -> str | None:
        """The plugin whose package defines ``obj``'s class, for attributing a failure."""
        cls = obj if isinstance(obj, type) else type(obj)
        package = cls.__module__.split(".")[0]
        for name, record in self.records.items():
            if record.status == "active" and record.module.split(".")[0].split(":")[0] == package:
                return name
        return None

    def provider_error(self, what: str, obj: Any, error: BaseException) -> RunError:
        """A ``RunError`` for a failing model, input or checkpointer, naming its plugin."""
        owner = self.owner_of(obj)
        name = (obj if isinstance(obj, type) else type(obj)).__name__
        source = f" from plugin '{owner}' ({self.records[owner].label})" if owner else ""
        detail = f"{type(error).__name__}: {error}".splitlines()[0]
        return RunError(f"{what} {name}{source} failed: {detail}")

    def active_versions(self) -> dict[str, str]:
        """``{plugin: "distribution version"}`` of every active plugin, for the job record."""
        return {n: r.label for n, r in self.records.items() if r.status == "active"}
