"""Entry point of ``pax-pipeline``: registrations only.

``pax plugins`` and ``pax --help`` import this module, so it imports nothing but ``pax_core``.
"""

from __future__ import annotations

from pax_core import Component, hookimpl

# The range of pax_core.API_VERSION this plugin is built for.
PAX_API = ">=1.3,<2"


@hookimpl
def pax_register_partitioners() -> list[Component]:
    return [Component("pipeline", "pax_pipeline.partitioners:PipelinePartitioner",
                      "SPMD with a stage mesh axis: Pax's GPipe and circular pipelines")]

