"""Entry point of ``pax-transformer``: the layer library registers nothing of its own.

A plugin still, so that ``pax plugins`` lists it and its ``PAX_API`` range is checked; the
layers are used through the public face (``pax_transformer``) by the models of other packages.
"""

from __future__ import annotations

# The range of pax_core.API_VERSION this plugin is built for.
PAX_API = ">=1.22,<2"
