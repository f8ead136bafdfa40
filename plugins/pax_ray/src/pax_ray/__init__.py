"""pax sweep's trials on a Ray cluster.

Importing this package does not import Ray; ``pax_ray.runners`` does.
"""

from __future__ import annotations

__version__ = "0.1.0"
