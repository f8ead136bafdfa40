"""Pax on NVIDIA GPUs: the ``gpu`` backend.

Importing this package does not import JAX; ``pax_gpu.backends`` does.
"""

from __future__ import annotations

__version__ = "0.1.0"
