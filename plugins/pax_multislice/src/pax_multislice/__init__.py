"""Pax multi-slice training: the ICI x DCN mesh over slices, and what the TPU runtime needs to
join them.

Importing this package does not import JAX; ``pax_multislice.layouts`` does.
"""

from __future__ import annotations

__version__ = "0.1.0"
