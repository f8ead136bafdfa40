"""pax-mlflow passes the conformance suite every plugin runs."""

import pytest

from pax_core.testing import PluginConformance


class TestConformance(PluginConformance):
    plugin = "mlflow"

    @pytest.fixture(autouse=True)
    def tracking_uri(self, monkeypatch):
        """The logger is built, not used: a tracking URI it is not asked to reach."""
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
