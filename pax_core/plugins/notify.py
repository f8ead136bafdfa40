"""Lifecycle notifications: telling plugins about a run without letting them break it."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from pax_core.errors import warn

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
    """Call every implementation of a ``pax_on_*`` hook; one that raises is reported, not fatal.

    Each implementation is called on its own (not through pluggy's caller, which stops at the
    first exception) so that one faulty plugin cannot keep the others from being told.
    """
    hook = getattr(pm.hook, hook_name)
    for impl in reversed(hook.get_hookimpls()):
        try:
            impl.function(**{name: kwargs[name] for name in impl.argnames})
        except Exception as e:
            warn(f"plugin '{impl.plugin_name}' raised in {hook_name}: {type(e).__name__}: {e}")
