"""Pax's image classification: ResNet, ViT and Pax's MNIST CNN, image inputs, experiments.

The names below are pax-vision's public face, for other packages and for users' own
experiments; each is imported on first use (PEP 562), so that ``pax plugins`` (which imports
``pax_vision.plugin``) never imports JAX.
"""

from __future__ import annotations

from pax_core import public_face

__version__ = "0.1.0"

_EXPORTS = {
    "ImageClassifier": "pax_vision.models",
    "ImageClassificationExperiment": "pax_vision.experiments.base",
    "ImageInput": "pax_vision.inputs.base",
    "IdxInput": "pax_vision.inputs.arrays",
    "DigitsInput": "pax_vision.inputs.arrays",
    "ImageFolderInput": "pax_vision.inputs.encoded",
    "TfdsImageInput": "pax_vision.inputs.encoded",
}
__all__ = sorted(["__version__", *_EXPORTS])
__getattr__ = public_face(__name__, _EXPORTS)
