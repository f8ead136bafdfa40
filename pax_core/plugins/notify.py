"""Lifecycle notifications: telling plugins about a run without letting them break it."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from pax_core.errors import warn
from pax_core.plugins.calls import call_one, implementers

if TYPE_CHECKING:
    import pluggy


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What a notification hook knows about the run it is told about."""

    experiment: str
    job_dir: str
    num_train_steps: int
    start_step: int
    process_index: int = 0
    process_count: int = 1


def notify(pm: pluggy.PluginManager, hook_name: str, **kwargs: Any) -> None:
    """Call a ``pax_on_*`` hook of every plugin; one that raises is reported, not fatal.

    Each plugin is called through pluggy on its own (with every wrapper around it): pluggy's
    caller stops at the first exception, and one faulty plugin must not keep the others from
    being told.
    """
    for plugin_name in implementers(pm, hook_name):
        try:
            call_one(pm, hook_name, plugin_name, **kwargs)
        except Exception as e:
            warn(f"plugin '{plugin_name}' raised in {hook_name}: {type(e).__name__}: {e}")
