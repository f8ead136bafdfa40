"""pax-speech passes the conformance suite every plugin runs (the usual ASR size is planned in
test_speech_cli.py, as a user runs `pax plan`)."""

from pax_core.testing import PluginConformance


class TestConformance(PluginConformance):
    plugin = "speech"
    plan_experiments = ("TinySpeechForTests",)
