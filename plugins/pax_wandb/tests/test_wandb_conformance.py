"""pax-wandb passes the conformance suite every plugin runs."""

from pax_core.testing import PluginConformance


class TestConformance(PluginConformance):
    plugin = "wandb"
