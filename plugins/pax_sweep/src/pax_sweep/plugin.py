"""Entry point of ``pax-sweep``: registrations only.

``pax plugins`` and ``pax --help`` import this module, so it imports nothing but ``pax_core``.
"""

from __future__ import annotations

from pax_core import Component, hookimpl

# The range of pax_core.API_VERSION this plugin is built for.
PAX_API = ">=1.12,<2"


@hookimpl
def pax_register_commands() -> list[Component]:
    return [Component("sweep", "pax_sweep.commands:sweep",
                      "tune an experiment: trials proposed by a PyGlove algorithm, each a pax "
                      "train job")]


@hookimpl
def pax_register_trial_runners() -> list[Component]:
    return [Component("local", "pax_sweep.runners:LocalRunner",
                      "pax sweep's trials as processes of this machine")]
