"""Entry point of ``pax-transformer``: registrations only.

``pax plugins`` and ``pax --help`` import this module, so it imports nothing but
``pax_core``; the model itself is named by a ``"module:attr"`` string and imported when used.
"""

from __future__ import annotations

from pax_core import hookimpl
from pax_core.plugins.records import Component


@hookimpl
def pax_register_models() -> list[Component]:
    return [
        Component(
            "transformer_lm",
            "pax_transformer.model:TransformerLm",
            "decoder-only transformer (ids -> logits): MHA/GQA/MQA, rotary, KV cache, scan, remat",
        )
    ]
