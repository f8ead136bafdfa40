"""Pax pipeline parallelism: Pax's GPipe and circular schedules over a ``stage`` mesh axis.

The names below are imported lazily (PEP 562) so that importing ``pax_pipeline.plugin``, which
``pax plugins`` does, never imports JAX.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Pipeline": "pax_pipeline.layers",
    "PipelinedStack": "pax_pipeline.layers",
    "Schedule": "pax_pipeline.schedule",
    "experiment_settings": "pax_pipeline.schedule",
}
__all__ = ["Pipeline", "PipelinedStack", "Schedule", "__version__", "experiment_settings"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pax_pipeline' has no attribute {name!r}")
