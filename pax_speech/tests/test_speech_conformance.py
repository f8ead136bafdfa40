"""pax-speech passes the conformance suite every plugin runs (the usual ASR size is planned in
test_speech_cli.py, as a user runs `pax plan`)."""

import pytest

from pax_core.testing import PluginConformance
from pax_speech.experiments.demo import QuickStartSpeech
from pax_speech.experiments.librispeech import LibriSpeechConformer


class TestConformance(PluginConformance):
    plugin = "speech"
    plan_experiments = ("TinySpeechForTests",)
    trained_experiment = "TinySpeechForTests"

    @pytest.fixture
    def trained_settings(self, tone_data) -> list[str]:
        # No random masks or dropout: each step's loss is then the batch's own.
        return [f"DATA_DIR='{tone_data}'", "SPEC_AUGMENT=False", "DROPOUT_RATE=0.0"]

    @pytest.fixture
    def data_settings(self, host, experiment, request) -> list[str]:
        # The demo experiments read the demo data (spoken where the voices are installed);
        # LibriSpeech's a stand-in in its layout, in batches its few utterances fill and
        # without its 16 worker processes (whose batches test_speech_inputs.py checks against
        # this process's).
        experiment_class = host.components("experiments").get(f"speech/{experiment}").load()
        if issubclass(experiment_class, QuickStartSpeech):
            folder, _ = request.getfixturevalue("demo_data")
            return [f"DATA_DIR='{folder}'"]
        if issubclass(experiment_class, LibriSpeechConformer):
            return [f"DATA_DIR='{request.getfixturevalue('librispeech_standin')}'",
                    "BATCH_SIZE=8", "EVAL_BATCH_SIZE=8", "INPUT_WORKERS=0"]
        return []
