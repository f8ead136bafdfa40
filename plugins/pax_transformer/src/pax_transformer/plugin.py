"""Entry point of ``pax-transformer``: registrations only.

``pax plugins`` and ``pax --help`` import this module, so it imports nothing but
``pax_core``; the model itself is named by a ``"module:attr"`` string and imported when used.
"""

from __future__ import annotations

from pax_core import Component, hookimpl

# The range of pax_core.API_VERSION this plugin is built for.
PAX_API = ">=1.8,<2"


@hookimpl
def pax_register_models() -> list[Component]:
    return [
        Component(
            "transformer_lm",
            "pax_transformer.models:TransformerLm",
            "decoder-only transformer (ids -> logits): MHA/GQA/MQA, rotary, KV cache, scan, remat",
        )
    ]
