"""pax-speech passes the conformance suite every plugin runs (the usual ASR size is planned in
test_speech_cli.py, as a user runs `pax plan`)."""

import pytest

from pax_core.testing import PluginConformance


class TestConformance(PluginConformance):
    plugin = "speech"
    plan_experiments = ("TinySpeechForTests",)
    trained_experiment = "TinySpeechForTests"

    @pytest.fixture
    def trained_settings(self, tone_data) -> list[str]:
        # No random masks or dropout: each step's loss is then the batch's own.
        return [f"DATA_DIR='{tone_data}'", "SPEC_AUGMENT=False", "DROPOUT_RATE=0.0"]
