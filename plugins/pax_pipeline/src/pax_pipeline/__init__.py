"""Pax pipeline parallelism: Pax's GPipe and circular schedules over a ``stage`` mesh axis.

The names below are imported lazily (PEP 562) so that importing ``pax_pipeline.plugin``, which
``pax plugins`` does, never imports JAX.
"""

from __future__ import annotations

from pax_core import public_face

__version__ = "0.1.0"

_EXPORTS = {
    "Pipeline": "pax_pipeline.layers",
    "PipelinedStack": "pax_pipeline.layers",
    "Schedule": "pax_pipeline.schedule",
    "experiment_settings": "pax_pipeline.schedule",
}
__all__ = ["Pipeline", "PipelinedStack", "Schedule", "__version__", "experiment_settings"]
__getattr__ = public_face(__name__, _EXPORTS)
