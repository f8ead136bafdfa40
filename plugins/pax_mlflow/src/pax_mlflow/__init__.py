"""Pax's metrics and settings in MLflow: the ``mlflow`` logger (``loggers``), one MLflow run per
job directory, sent by a thread of its own (``sender``), with the job's settings as the run's
params (``params``).

The name below is the package's public face, imported on first use (PEP 562), so that
importing ``pax_mlflow.plugin``, which ``pax plugins`` does, does not import MLflow.
"""

from __future__ import annotations

from pax_core import public_face

__version__ = "0.1.0"

_EXPORTS = {
    "MlflowLogger": "pax_mlflow.loggers",  # LOGGERS=(..., 'mlflow')
}
__all__ = sorted(["__version__", *_EXPORTS])
__getattr__ = public_face(__name__, _EXPORTS)
