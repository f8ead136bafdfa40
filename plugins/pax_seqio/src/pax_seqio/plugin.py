"""Entry point of ``pax-seqio``: registrations only.

``pax plugins`` and ``pax --help`` import this module, so it imports nothing but ``pax_core``:
TensorFlow and SeqIO load only when a run builds a ``SeqIOInput``.
"""

from __future__ import annotations

from pax_core import Component, hookimpl

# The range of pax_core.API_VERSION this plugin is built for.
PAX_API = ">=1.12,<2"


@hookimpl
def pax_register_inputs() -> list[Component]:
    return [Component("seqio", "pax_seqio.inputs:SeqIOInput",
                      "a SeqIO task or mixture by name, sharded per process (TensorFlow)")]
