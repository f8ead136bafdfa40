"""Entry point of pax-speech: registrations only, nothing heavy imported."""

from pax_core import Component, hookimpl
from pax_speech.experiments.catalogue import EXPERIMENTS

# The range of pax_core.API_VERSION this plugin is built for.
PAX_API = ">=1.12,<2"


@hookimpl
def pax_register_models():
    return [Component("ctc_recognizer", "pax_speech.models:CtcRecognizer",
                      "log-mel features, a Conformer encoder and a CTC head over characters; "
                      "greedy decoding, WER and CER in eval")]


@hookimpl
def pax_register_inputs():
    return [Component("manifest", "pax_speech.inputs.manifest:ManifestInput",
                      "a JSONL manifest of WAV/FLAC files and transcripts, in length buckets")]


@hookimpl
def pax_register_commands():
    return [Component("speech", "pax_speech.commands.demo_data:app",
                      "speech data: make-demo-data speaks a small training set"),
            Component("transcribe", "pax_speech.commands.transcribe:transcribe",
                      "transcripts of WAV/FLAC files by a trained recognizer")]


@hookimpl
def pax_register_experiments():
    return list(EXPERIMENTS)
