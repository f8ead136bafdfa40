"""The base of pax-vision's experiments: the classifier and its data from UPPER_CASE constants,
on the core's skeleton (``pax_core.SingleTaskExperiment``: optimizer, schedule, training), with
the defaults of Pax's vision experiments (``--set LEARNING_RATE=0.2`` means what a Pax user
expects). Subclasses choose the backbone (``backbone()``) and mix in their data."""

from __future__ import annotations

import os

import fiddle as fdl

from pax_core import SingleTaskExperiment
from pax_vision.inputs.arrays import DigitsInput, IdxInput
from pax_vision.inputs.encoded import ImageFolderInput, TfdsImageInput
from pax_vision.models import ImageClassifier

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class ImageClassificationExperiment(SingleTaskExperiment):
    """A ``NUM_CLASSES``-way classifier of ``IMAGE_SIZE`` square images of ``CHANNELS``.

    SGD with momentum at a constant rate by default. ``LR_SCHEDULE = "piecewise"`` is the
    ResNet recipe in epochs: a linear ramp over ``LR_WARMUP_EPOCHS``, then the learning rate
    times ``LR_DECAY_VALUES`` from ``LR_DECAY_EPOCHS`` (an epoch is ``NUM_TRAIN_EXAMPLES``
    images). Early stopping watches eval top-1 accuracy (``EARLY_STOP_TARGET``).
    """

    constant_aliases = {"TARGET_ACCURACY": "EARLY_STOP_TARGET"}

    # Model.
    NUM_CLASSES = 10
    IMAGE_SIZE = 28
    CHANNELS = 1
    MEAN: tuple[float, ...] = (0.5,)
    STD: tuple[float, ...] = (0.5,)
    HEAD_INIT_STD = 0.01
    LABEL_SMOOTHING = 0.0
    MIXUP_ALPHA = 0.0
    CLASS_NAMES: tuple[str, ...] = ()
    FPROP_DTYPE = "float32"

    # Optimizer.
    OPTIMIZER = "sgd"
    LEARNING_RATE = 0.1
    MOMENTUM = 0.9
    ADAM_EPSILON = 1e-8
    LR_WARMUP_EPOCHS = 5
    LR_DECAY_EPOCHS: tuple[int, ...] = (30, 60, 80)
    LR_DECAY_VALUES: tuple[float, ...] = (0.1, 0.01, 0.001)

    # Training.
    BATCH_SIZE = 256
    NUM_TRAIN_EXAMPLES = 60_000  # one epoch: what the schedule's epochs count
    NUM_TRAIN_STEPS = 1000
    CHECKPOINT_EVERY_N_STEPS = 1000
    EARLY_STOP_METRIC = "accuracy"
    EARLY_STOP_HIGHER_IS_BETTER = True
    INPUT_WORKERS = 0
    ON_BAD_IMAGE = "skip"
    ICI_MESH_SHAPE: list[int] | None = None  # Pax's data-parallel path: every device

    def steps_per_epoch(self) -> int:
        return max(1, self.NUM_TRAIN_EXAMPLES // self.global_batch_size())

    def derive_constants(self) -> None:
        """The piecewise schedule's boundaries in steps, from its epochs."""
        epoch = self.steps_per_epoch()
        if self.LR_PIECEWISE_BOUNDARIES is None:
            self.LR_PIECEWISE_BOUNDARIES = tuple(
                e * epoch for e in (self.LR_WARMUP_EPOCHS, *self.LR_DECAY_EPOCHS))
        if self.LR_PIECEWISE_VALUES is None:
            self.LR_PIECEWISE_VALUES = (1.0, *self.LR_DECAY_VALUES)
        super().derive_constants()

    def backbone(self) -> fdl.Config:
        raise NotImplementedError(f"{type(self).__name__} must choose its backbone")

    def model(self) -> fdl.Config[ImageClassifier]:
        return fdl.Config(ImageClassifier, backbone=self.backbone(),
                          num_classes=self.NUM_CLASSES, image_size=self.IMAGE_SIZE,
                          channels=self.CHANNELS, mean=tuple(self.MEAN), std=tuple(self.STD),
                          head_init_std=self.HEAD_INIT_STD, label_smoothing=self.LABEL_SMOOTHING,
                          mixup_alpha=self.MIXUP_ALPHA, class_names=tuple(self.CLASS_NAMES))

    def input_settings(self) -> dict:
        """What every dataset of the experiment shares."""
        return dict(batch_size=self.global_batch_size(), image_size=self.IMAGE_SIZE,
                    num_classes=self.NUM_CLASSES, on_bad_image=self.ON_BAD_IMAGE)


class IdxData:
    """Mixin: MNIST-format IDX files in ``DATA_DIR`` (Fashion-MNIST where Debian's
    ``dataset-fashion-mnist`` puts it), trained on ``train``, evaluated on all of ``test``."""

    DATA_DIR = "/usr/share/datasets/fashion-mnist"

    def datasets(self) -> list[fdl.Config[IdxInput]]:
        common = dict(folder=self.DATA_DIR, class_names=tuple(self.CLASS_NAMES),
                      **self.input_settings())
        return [fdl.Config(IdxInput, name="train", split="train", is_training=True,
                           seed=1234, num_workers=self.INPUT_WORKERS, **common),
                fdl.Config(IdxInput, name="test", split="test", is_training=False,
                           eval_num_batches=-1, **common)]


class DigitsData:
    """Mixin: scikit-learn's UCI digits (``pax-vision[digits]``), evaluated on the held-out
    360."""

    def datasets(self) -> list[fdl.Config[DigitsInput]]:
        common = self.input_settings()
        return [fdl.Config(DigitsInput, name="train", split="train", is_training=True,
                           seed=1234, **common),
                fdl.Config(DigitsInput, name="heldout", split="test", is_training=False,
                           eval_num_batches=-1, **common)]


class ImagenetData:
    """Mixin: ImageNet from ``IMAGENET_DIR``: TFDS's built ``imagenet2012`` version folder
    (``IMAGENET_FORMAT = "tfds"``: splits train and validation), or a folder with ``train/``
    and ``val/`` of class subfolders (``"folder"``). Training images are augmented (random
    resized crops, flips); evaluation reads all of the validation split, centre-cropped."""

    IMAGENET_DIR = "~/tensorflow_datasets/imagenet2012/5.1.0"
    IMAGENET_FORMAT = "tfds"
    NUM_TRAIN_EXAMPLES = 1_281_167
    NUM_CLASSES = 1000
    IMAGE_SIZE = 224
    CHANNELS = 3
    MEAN = IMAGENET_MEAN
    STD = IMAGENET_STD
    CROP_SCALE = (0.08, 1.0)
    INPUT_WORKERS = 16

    def datasets(self) -> list[fdl.Config]:
        root = os.path.expanduser(self.IMAGENET_DIR)
        if self.IMAGENET_FORMAT == "tfds":
            cls, train, evaluate = TfdsImageInput, dict(folder=root, split="train"), dict(
                folder=root, split="validation")
        elif self.IMAGENET_FORMAT == "folder":
            cls, train, evaluate = (ImageFolderInput, dict(root=os.path.join(root, "train")),
                                    dict(root=os.path.join(root, "val")))
        else:
            raise ValueError(f"IMAGENET_FORMAT {self.IMAGENET_FORMAT!r} is not tfds or folder")
        common = self.input_settings()
        return [fdl.Config(cls, name="train", is_training=True, seed=1234, augment=True,
                           crop_scale=tuple(self.CROP_SCALE), num_workers=self.INPUT_WORKERS,
                           **train, **common),
                fdl.Config(cls, name="validation", is_training=False, eval_num_batches=-1,
                           **evaluate, **common)]
