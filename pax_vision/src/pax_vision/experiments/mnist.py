"""Pax's ``tasks.vision.params.mnist``, and its CNN trained well on Fashion-MNIST.

``MnistExperiment`` keeps Pax's values (the CNN, SGD with momentum 0.1 at 0.01, batch 1024,
1000 steps); Pax read MNIST through TFDS, here the IDX files in ``DATA_DIR`` (Fashion-MNIST,
Debian's ``dataset-fashion-mnist``, by default; ``--set DATA_DIR=...`` for MNIST's own files).
"""

from __future__ import annotations

import fiddle as fdl

from pax_vision.experiments.base import IdxData, ImageClassificationExperiment
from pax_vision.inputs.arrays import FASHION_MNIST_CLASSES
from pax_vision.layers.cnn import MnistCnn


class MnistExperiment(IdxData, ImageClassificationExperiment):
    """Pax's MNIST CNN: two 3x3 convolutions (32, 64 channels) with ReLU and 2x2 average
    pooling, a 256-unit dense layer, 10 classes; SGD, momentum 0.1, learning rate 0.01."""

    CLASS_NAMES = FASHION_MNIST_CLASSES
    OPTIMIZER = "sgd"
    LEARNING_RATE = 0.01
    MOMENTUM = 0.1
    BATCH_SIZE = 1024
    NUM_TRAIN_STEPS = 1000
    EVAL_INTERVAL_STEPS = 100
    CHECKPOINT_EVERY_N_STEPS = 500

    def backbone(self) -> fdl.Config[MnistCnn]:
        return fdl.Config(MnistCnn, dtype=self.FPROP_DTYPE)


class FashionMnistCnn(MnistExperiment):
    """Pax's MNIST CNN trained to 0.909 test top-1 on Fashion-MNIST: Adam at 1e-3 with a cosine
    decay, batch 128, eight epochs (11 minutes on two CPU cores)."""

    OPTIMIZER = "adam"
    LEARNING_RATE = 1e-3
    LR_SCHEDULE = "cosine"
    LR_COS_WARMUP = 100
    BATCH_SIZE = 128
    NUM_TRAIN_STEPS = 3750
    SUMMARY_INTERVAL_STEPS = 250
    EVAL_INTERVAL_STEPS = 1250
    CHECKPOINT_EVERY_N_STEPS = 1250
    CHECKPOINT_MAX_TO_KEEP = 2
