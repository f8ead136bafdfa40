"""Calling one plugin's hook through pluggy, and tracing every hook call.

The host needs to know which plugin returned what (registrations are attributed) and to keep a
failing plugin from silencing the others (notifications), which pluggy's caller does not do: it
returns one list of results and stops at the first exception. So each plugin's implementation is
called through a pluggy subset caller that holds it and every hook wrapper, which keeps wrappers,
``tryfirst``/``trylast`` and call monitoring working.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pluggy


def _is_wrapper(impl: pluggy.HookImpl) -> bool:
    return bool(impl.wrapper or impl.hookwrapper)


def implementers(pm: pluggy.PluginManager, hook_name: str) -> list[str]:
    """The plugins implementing ``hook_name`` (wrappers aside), in pluggy's call order: the
    plugin registered last first, ``tryfirst``/``trylast`` respected."""
    impls = getattr(pm.hook, hook_name).get_hookimpls()
    return [i.plugin_name for i in reversed(impls) if not _is_wrapper(i)]


def call_one(pm: pluggy.PluginManager, hook_name: str, plugin_name: str, **kwargs: Any
             ) -> list[Any]:
    """Call ``plugin_name``'s implementation of ``hook_name``, inside every wrapper."""
    impls = getattr(pm.hook, hook_name).get_hookimpls()
    others = {i.plugin_name: i.plugin for i in impls
              if i.plugin_name != plugin_name and not _is_wrapper(i)}
    return pm.subset_hook_caller(hook_name, remove_plugins=others.values())(**kwargs)


class CallTrace:
    """``PAX_TRACE_PLUGINS=1``: one stderr line per hook call, with the plugins it reached and
    its duration."""

    def __init__(self) -> None:
        self._started: list[float] = []

    def install(self, pm: pluggy.PluginManager) -> None:
        pm.add_hookcall_monitoring(self._before, self._after)

    def _before(self, hook_name: str, impls: list[pluggy.HookImpl], kwargs: Any) -> None:
        self._started.append(time.perf_counter())

    def _after(self, outcome: Any, hook_name: str, impls: list[pluggy.HookImpl],
               kwargs: Any) -> None:
        ms = (time.perf_counter() - self._started.pop()) * 1e3
        plugins = ", ".join(i.plugin_name for i in impls) or "none"
        raised = f", raised {type(outcome.exception).__name__}" if outcome.exception else ""
        print(f"pax: trace: {hook_name} [{plugins}] {ms:.2f} ms{raised}", file=sys.stderr,
              flush=True)
