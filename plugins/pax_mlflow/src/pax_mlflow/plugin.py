"""Entry point of ``pax-mlflow``: its registrations.

``pax plugins`` and ``pax --help`` import this module, so it imports nothing but ``pax_core``
(no MLflow).
"""

from __future__ import annotations

from pax_core import Component, hookimpl

# The range of pax_core.API_VERSION this plugin is built for: 1.18 tells a logger how the
# training ended (Logger.finish), which ends the job's MLflow run.
PAX_API = ">=1.18,<2"


@hookimpl
def pax_register_loggers() -> list[Component]:
    return [Component("mlflow", "pax_mlflow.loggers:MlflowLogger",
                      "an MLflow run per job (MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME)")]
