"""Pax's speech recognition: a log-mel front end, Conformer + CTC, audio manifests, WER/CER.

The names below are pax-speech's public face, for other packages and for users' own
experiments; each is imported on first use (PEP 562), so that ``pax plugins`` (which imports
``pax_speech.plugin``) never imports JAX.
"""

from __future__ import annotations

from pax_core import public_face

__version__ = "0.1.0"

_EXPORTS = {
    "CtcRecognizer": "pax_speech.models",
    "SpeechRecognitionExperiment": "pax_speech.experiments.base",
    "ManifestInput": "pax_speech.inputs.manifest",
}
__all__ = sorted(["__version__", *_EXPORTS])
__getattr__ = public_face(__name__, _EXPORTS)
