"""Entry point of ``pax-wandb``: its registrations.

``pax plugins`` and ``pax --help`` import this module, so it imports nothing but ``pax_core``
(no wandb).
"""

from __future__ import annotations

from pax_core import Component, hookimpl

# The range of pax_core.API_VERSION this plugin is built for: 1.18 tells a logger how the
# training ended (Logger.finish), which ends the job's W&B run.
PAX_API = ">=1.18,<2"


@hookimpl
def pax_register_loggers() -> list[Component]:
    return [Component("wandb", "pax_wandb.loggers:WandbLogger",
                      "a Weights & Biases run per job (WANDB_PROJECT, WANDB_MODE, ...)")]
