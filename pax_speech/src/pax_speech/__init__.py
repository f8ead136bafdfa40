"""Pax's speech recognition: a log-mel front end, Conformer + CTC, audio manifests, WER/CER."""

__version__ = "0.1.0"
