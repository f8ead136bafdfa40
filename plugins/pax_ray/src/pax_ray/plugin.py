"""Entry point of ``pax-ray``: registrations only.

``pax plugins`` and ``pax --help`` import this module, so it imports nothing but ``pax_core``.
"""

from __future__ import annotations

from pax_core import Component, hookimpl

# The range of pax_core.API_VERSION this plugin is built for.
PAX_API = ">=1.9,<2"


@hookimpl
def pax_register_trial_runners() -> list[Component]:
    return [Component("ray", "pax_ray.runners:RayRunner",
                      "each trial a Ray actor with the resources it declares (RAY_ADDRESS)")]
