"""pax-transformer passes the conformance suite every plugin runs (it registers a model only)."""

from pax_core.testing import PluginConformance


class TestConformance(PluginConformance):
    plugin = "transformer"
