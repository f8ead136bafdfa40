"""Classifiers of scikit-learn's 8x8 handwritten digits (``pip install 'pax-vision[digits]'``):
the quick start, and the tests' small CNN, ResNet and ViT, which train in seconds on a CPU."""

from __future__ import annotations

import fiddle as fdl

from pax_vision.experiments.base import DigitsData
from pax_vision.experiments.mnist import MnistExperiment
from pax_vision.layers.cnn import MnistCnn
from pax_vision.layers.resnet import ResNet
from pax_vision.layers.vit import VisionTransformer


class QuickStartDigits(DigitsData, MnistExperiment):
    """The quick start: Pax's MNIST CNN on scikit-learn's 8x8 handwritten digits
    (``pip install 'pax-vision[digits]'``), no download. 1,437 training images, 360 held out;
    about 20 seconds on two CPU cores to 0.98 held-out top-1. Then
    ``pax predict --plugin vision --job-dir DIR image.png`` names the digit of an image."""

    IMAGE_SIZE = 8
    CLASS_NAMES = tuple(str(d) for d in range(10))
    NUM_TRAIN_EXAMPLES = 1437
    OPTIMIZER = "adam"
    LEARNING_RATE = 3e-3
    LR_SCHEDULE = "cosine"
    LR_COS_WARMUP = 20
    BATCH_SIZE = 64
    NUM_TRAIN_STEPS = 400
    SUMMARY_INTERVAL_STEPS = 50
    EVAL_INTERVAL_STEPS = 100
    CHECKPOINT_EVERY_N_STEPS = 200
    CHECKPOINT_MAX_TO_KEEP = 2


class TinyDigitsForTests(QuickStartDigits):
    """The quick start cut down for tests: a narrower CNN, 40 steps."""

    BATCH_SIZE = 32
    LEARNING_RATE = 0.02
    NUM_TRAIN_STEPS = 40
    LR_COS_WARMUP = 5
    SUMMARY_INTERVAL_STEPS = 10
    EVAL_INTERVAL_STEPS = 20
    CHECKPOINT_EVERY_N_STEPS = 20

    def backbone(self) -> fdl.Config[MnistCnn]:
        return fdl.Config(MnistCnn, channels=(8, 16), hidden_dims=32, dtype=self.FPROP_DTYPE)


class TinyResNetForTests(TinyDigitsForTests):
    """A ResNet-18 of width 4 on the digits enlarged to 32x32, trained as the ImageNet
    ResNets are (Nesterov SGD, L2 off the 1-D parameters, synchronised batch norm)."""

    IMAGE_SIZE = 32
    OPTIMIZER = "sgd"
    LEARNING_RATE = 0.1
    MOMENTUM = 0.9
    NESTEROV = True
    L2_REGULARIZER_WEIGHT = 1e-4
    SKIP_LP_1D_VECTORS = True

    def backbone(self) -> fdl.Config[ResNet]:
        return fdl.Config(ResNet, depth=18, width=4, dtype=self.FPROP_DTYPE)


class TinyViTForTests(TinyDigitsForTests):
    """A two-layer ViT of width 32 on the digits enlarged to 16x16, in 4x4 patches."""

    IMAGE_SIZE = 16
    HEAD_INIT_STD = 0.0
    LEARNING_RATE = 3e-3

    def backbone(self) -> fdl.Config[VisionTransformer]:
        return fdl.Config(VisionTransformer, patch_size=4, model_dims=32, num_layers=2,
                          num_heads=2, hidden_dims=64, pooling="cls", dtype=self.FPROP_DTYPE)
