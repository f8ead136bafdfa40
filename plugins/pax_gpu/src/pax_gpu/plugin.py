"""Entry point of ``pax-gpu``: registrations only.

``pax plugins`` and ``pax --help`` import this module, so it imports nothing but ``pax_core``.
"""

from __future__ import annotations

from pax_core import Component, hookimpl

# The range of pax_core.API_VERSION this plugin is built for.
PAX_API = ">=1.7,<2"


@hookimpl
def pax_register_backends() -> list[Component]:
    return [Component("gpu", "pax_gpu.backends:GpuBackend",
                      "NVIDIA GPUs: XLA/NCCL presets, cuDNN fused attention")]


@hookimpl
def pax_register_commands() -> list[Component]:
    return [Component("gpu", "pax_gpu.commands:app",
                      "check this machine's GPU: cuDNN attention and FP8 against references "
                      "(pax gpu check)")]
