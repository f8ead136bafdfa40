"""Hyper-parameter sweeps for Pax (``pax sweep``): search spaces (``space``), the algorithms
(``algorithms``: PyGlove's, and OSS Vizier's in ``vizier``), early stopping (``stopping``), the
sweep directory (``record``), trial runners (``runners``), the loop that ties them (``driver``),
a trial's metrics (``metrics``), the results (``results``) and the command (``commands``).

The names below are the package's public face, imported on first use (PEP 562), so that
importing ``pax_sweep.plugin``, which ``pax plugins`` does, imports neither PyGlove nor JAX.
"""

from __future__ import annotations

from pax_core import public_face

__version__ = "0.1.0"

_EXPORTS = {
    "SearchSpace": "pax_sweep.space",  # what Experiment.search() returns
    "TrialRunner": "pax_sweep.runners",  # where trials run: the base of a runner plugin
    "LocalRunner": "pax_sweep.runners",
}
__all__ = sorted(["__version__", *_EXPORTS])
__getattr__ = public_face(__name__, _EXPORTS)
