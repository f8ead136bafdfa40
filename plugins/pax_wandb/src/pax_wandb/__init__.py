"""Pax's metrics and settings in Weights & Biases: the ``wandb`` logger (``loggers``), one W&B
run per job directory, and the job's settings as the run's config (``settings``).

The name below is the package's public face, imported on first use (PEP 562), so that
importing ``pax_wandb.plugin``, which ``pax plugins`` does, does not import wandb.
"""

from __future__ import annotations

from pax_core import public_face

__version__ = "0.1.0"

_EXPORTS = {
    "WandbLogger": "pax_wandb.loggers",  # LOGGERS=(..., 'wandb')
}
__all__ = sorted(["__version__", *_EXPORTS])
__getattr__ = public_face(__name__, _EXPORTS)
