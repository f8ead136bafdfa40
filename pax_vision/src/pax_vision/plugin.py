"""Entry point of pax-vision: registrations only, nothing heavy imported."""

from pax_core import Component, hookimpl
from pax_vision.experiments.catalogue import EXPERIMENTS

# The range of pax_core.API_VERSION this plugin is built for.
PAX_API = ">=1.12,<2"


@hookimpl
def pax_register_models():
    return [Component("image_classifier", "pax_vision.models:ImageClassifier",
                      "a backbone (CNN, ResNet, ViT) and a linear head; softmax cross-entropy, "
                      "top-1 and top-5 accuracy")]


@hookimpl
def pax_register_inputs():
    return [Component("idx", "pax_vision.inputs.arrays:IdxInput",
                      "MNIST-format IDX files (MNIST, Fashion-MNIST)"),
            Component("digits", "pax_vision.inputs.arrays:DigitsInput",
                      "scikit-learn's 8x8 handwritten digits (pax-vision[digits])"),
            Component("image_folder", "pax_vision.inputs.encoded:ImageFolderInput",
                      "JPEG/PNG images in a subfolder per class, decoded in worker processes"),
            Component("tfds_images", "pax_vision.inputs.encoded:TfdsImageInput",
                      "a built TFDS image dataset (imagenet2012), ArrayRecord files")]


@hookimpl
def pax_register_commands():
    return [Component("predict", "pax_vision.commands.predict:predict",
                      "the top classes of images by a trained classifier")]


@hookimpl
def pax_register_experiments():
    return list(EXPERIMENTS)
