"""The core's own experiment: trains in seconds on any machine, with no modality installed."""

from __future__ import annotations

from typing import Any

import fiddle as fdl

from pax_core.config.single_task import SingleTaskExperiment
from pax_core.inputs.synthetic import SyntheticInput
from pax_core.models.mlp import MlpClassifier


class MlpSynthetic(SingleTaskExperiment):
    """An MLP learns a fixed random linear teacher on Gaussian features.

    Accuracy climbs well above chance within a hundred steps; use it to check an installation,
    a mesh, or a plugin's hooks without any data.
    """

    FEATURE_DIM = 16
    NUM_CLASSES = 4
    HIDDEN_DIMS = (64,)
    BATCH_SIZE = 64
    LEARNING_RATE = 3e-3
    CLIP_GRADIENT_NORM_TO_VALUE = 1.0
    LR_SCHEDULE = "linear_rampup_cosine_decay"
    LR_COS_WARMUP: int | None = None  # None: a twentieth of the steps
    LR_COS_MIN_RATIO = 0.1
    NUM_TRAIN_STEPS = 200
    CHECKPOINT_EVERY_N_STEPS = 100
    CHECKPOINT_MAX_TO_KEEP = 2
    SUMMARY_INTERVAL_STEPS = 20

    def derive_constants(self) -> None:
        if self.LR_COS_WARMUP is None:
            self.LR_COS_WARMUP = max(1, self.NUM_TRAIN_STEPS // 20)
        if self.LR_COS_DECAY_START is None:
            self.LR_COS_DECAY_START = self.LR_COS_WARMUP
        super().derive_constants()

    def model(self) -> fdl.Config[MlpClassifier]:
        return fdl.Config(MlpClassifier, num_classes=self.NUM_CLASSES,
                          hidden_dims=self.HIDDEN_DIMS)

    def search(self) -> Any:
        """``pax sweep --exp MlpSynthetic``: the learning rate and the width, judged by the
        held-out loss. Only ``pax sweep`` asks, and pax-sweep provides it, with PyGlove."""
        import pyglove as pg

        from pax_sweep import SearchSpace

        return SearchSpace(
            values={"LEARNING_RATE": pg.floatv(1e-4, 1e-1, scale="log"),
                    "HIDDEN_DIMS": pg.oneof([(8,), (32,), (128,)])},
            metric="eval/test loss", goal="minimize", max_trials=12)

    def datasets(self) -> list[fdl.Config[SyntheticInput]]:
        def features(name: str, is_training: bool, seed: int):
            return fdl.Config(SyntheticInput, name=name, is_training=is_training, seed=seed,
                              batch_size=self.global_batch_size(), kind="features",
                              feature_dim=self.FEATURE_DIM, num_classes=self.NUM_CLASSES,
                              eval_num_batches=4)

        return [features("train", True, 1234), features("test", False, 4321)]
