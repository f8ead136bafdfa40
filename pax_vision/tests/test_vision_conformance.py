"""pax-vision passes the conformance suite every plugin runs (the ImageNet models are planned in
test_vision_cli.py, as a user runs `pax plan`)."""

from pax_core.testing import PluginConformance


class TestConformance(PluginConformance):
    plugin = "vision"
    plan_experiments = ("TinyDigitsForTests",)
    trained_experiment = "TinyDigitsForTests"
