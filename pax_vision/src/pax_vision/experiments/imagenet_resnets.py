"""Pax's ``tasks.vision.params.imagenet_resnets``: ResNets on ImageNet after "ImageNet in 1
Hour" (Goyal et al. 2017). 224x224, batch 512, SGD with Nesterov momentum 0.9 at
(batch / 256) x 0.1, a linear ramp over 5 epochs and x0.1 at epochs 30, 60 and 80 of 90, L2
1e-4 on all but the 1-D parameters, batch norm synchronised across the data-parallel devices
with the last scale of every residual branch zero at the start, mesh [1, 8, 1], evaluation
every epoch on all 50,000 validation images."""

from __future__ import annotations

import fiddle as fdl

from pax_vision.experiments.base import ImageClassificationExperiment, ImagenetData
from pax_vision.layers.resnet import ResNet


class ResNet50Pjit(ImagenetData, ImageClassificationExperiment):
    """ResNet-50 v1.5 (25.6M parameters, 4.1 GMACs an image at 224)."""

    DEPTH = 50
    WIDTH = 64
    BATCH_SIZE = 512
    OPTIMIZER = "sgd"
    LEARNING_RATE = BATCH_SIZE / 256 * 0.1
    MOMENTUM = 0.9
    NESTEROV = True
    L2_REGULARIZER_WEIGHT = 1e-4
    SKIP_LP_1D_VECTORS = True
    LR_SCHEDULE = "piecewise"
    LR_WARMUP_EPOCHS = 5
    LR_DECAY_EPOCHS = (30, 60, 80)
    LR_DECAY_VALUES = (0.1, 0.01, 0.001)
    NUM_EPOCHS = 90
    EVAL_INTERVAL_STEPS = ImagenetData.NUM_TRAIN_EXAMPLES // BATCH_SIZE  # an epoch: 2502
    NUM_TRAIN_STEPS = NUM_EPOCHS * EVAL_INTERVAL_STEPS
    SUMMARY_INTERVAL_STEPS = 100
    CHECKPOINT_EVERY_N_STEPS = 5000
    ICI_MESH_SHAPE = [1, 8, 1]

    def backbone(self) -> fdl.Config[ResNet]:
        return fdl.Config(ResNet, depth=self.DEPTH, width=self.WIDTH, dtype=self.FPROP_DTYPE)


class ResNet18Pjit(ResNet50Pjit):
    DEPTH = 18


class ResNet101Pjit(ResNet50Pjit):
    DEPTH = 101


class ResNet152Pjit(ResNet50Pjit):
    DEPTH = 152


class ResNet200Pjit(ResNet50Pjit):
    DEPTH = 200
