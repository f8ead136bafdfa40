"""The experiments pax-vision registers; Pax's own also answer to their Pax paths.

Plain data, so that listing them imports nothing: each class is imported only when a run uses
it.
"""

from __future__ import annotations

from pax_core import ExperimentRef

_PAX_MODULES = {"mnist": "paxml.tasks.vision.params.mnist",
                "imagenet_resnets": "paxml.tasks.vision.params.imagenet_resnets"}


def _pax(module: str, name: str, summary: str) -> ExperimentRef:
    """One of Pax's experiments, under its Pax path too."""
    return ExperimentRef(name, f"pax_vision.experiments.{module}:{name}", summary,
                         aliases=(f"{_PAX_MODULES[module]}.{name}",))


def _own(module: str, name: str, summary: str) -> ExperimentRef:
    return ExperimentRef(name, f"pax_vision.experiments.{module}:{name}", summary)


EXPERIMENTS: list[ExperimentRef] = [
    _pax("mnist", "MnistExperiment",
         "Pax's MNIST CNN and SGD; IDX files (Fashion-MNIST by default)"),
    _own("mnist", "FashionMnistCnn", "Pax's MNIST CNN with Adam: 0.9+ on Fashion-MNIST on a CPU"),
    _own("digits", "QuickStartDigits",
         "the quick start: a CNN on scikit-learn's 8x8 digits, 20 seconds on a laptop CPU"),
    _own("digits", "TinyDigitsForTests", "the smallest digits classifier: for tests"),
    _own("digits", "TinyResNetForTests", "a ResNet-18 of width 4 on the digits: for tests"),
    _own("digits", "TinyViTForTests", "a two-layer ViT on the digits: for tests"),
    *(_pax("imagenet_resnets", f"ResNet{depth}Pjit",
           f"ResNet-{depth} v1.5 on ImageNet, Goyal et al.'s recipe, mesh [1, 8, 1]")
      for depth in (18, 50, 101, 152, 200)),
    *(_own("imagenet_vits", f"ViT{size}16Pjit",
           f"ViT-{size}/16 on ImageNet, the plain-ViT recipe, mesh [1, 8, 1]")
      for size in "SBL"),
]
