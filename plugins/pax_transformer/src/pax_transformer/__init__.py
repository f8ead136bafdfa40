"""Pax transformer layers: attention, feed-forward, norms, positions, remat, and a decoder-only LM.

The names below are imported lazily (PEP 562) so that importing ``pax_transformer.plugin``,
which ``pax plugins`` does, never imports JAX.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "BlockConfig": "pax_transformer.layers.block",
    "TransformerLm": "pax_transformer.models",
    "TransformerStack": "pax_transformer.layers.stack",
    "block_weights": "pax_transformer.layers.block",
    "count_params": "pax_transformer.models",
    "stack_layer_params": "pax_transformer.layers.stack",
}
__all__ = ["BlockConfig", "TransformerLm", "TransformerStack", "__version__", "block_weights",
           "count_params", "stack_layer_params"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pax_transformer' has no attribute {name!r}")
