"""The core's own experiment: trains in seconds on any machine, with no modality installed."""

from __future__ import annotations

from typing import Any

import fiddle as fdl

from pax_core.config.experiment import Experiment
from pax_core.config.optimizers import Adam
from pax_core.config.schedules import LinearRampupCosineDecay
from pax_core.config.task import Learner, Task, Train
from pax_core.inputs.synthetic import SyntheticInput
from pax_core.models.mlp import MlpClassifier


class MlpSynthetic(Experiment):
    """An MLP learns a fixed random linear teacher on Gaussian features.

    Accuracy climbs well above chance within a hundred steps; use it to check an installation,
    a mesh, or a plugin's hooks without any data.
    """

    FEATURE_DIM = 16
    NUM_CLASSES = 4
    HIDDEN_DIMS = (64,)
    BATCH_SIZE = 64
    LEARNING_RATE = 3e-3
    NUM_TRAIN_STEPS = 200

    def task(self) -> fdl.Config[Task]:
        warmup = max(1, self.NUM_TRAIN_STEPS // 20)
        schedule = fdl.Config(LinearRampupCosineDecay, warmup_steps=warmup, decay_start=warmup,
                              decay_end=self.NUM_TRAIN_STEPS, min_ratio=0.1)
        optimizer = fdl.Config(Adam, learning_rate=self.LEARNING_RATE, lr_schedule=schedule,
                               clip_gradient_norm_to_value=1.0)
        return fdl.Config(
            Task,
            model=fdl.Config(MlpClassifier, num_classes=self.NUM_CLASSES,
                             hidden_dims=self.HIDDEN_DIMS),
            train=fdl.Config(
                Train,
                learner=fdl.Config(Learner, optimizer=optimizer),
                num_train_steps=self.NUM_TRAIN_STEPS,
                save_interval_steps=100,
                save_max_to_keep=2,
                summary_interval_steps=20,
                eval_interval_steps=100,
            ),
        )

    def search(self) -> Any:
        """``pax sweep --exp MlpSynthetic``: the learning rate and the width, judged by the
        held-out loss (PyGlove is imported only by a sweep)."""
        import pyglove as pg

        from pax_core.sweep.space import SearchSpace

        return SearchSpace(
            values={"LEARNING_RATE": pg.floatv(1e-4, 1e-1, scale="log"),
                    "HIDDEN_DIMS": pg.oneof([(8,), (32,), (128,)])},
            metric="eval/test loss", goal="minimize", max_trials=12)

    def datasets(self) -> list[fdl.Config[SyntheticInput]]:
        def features(name: str, is_training: bool, seed: int):
            return fdl.Config(SyntheticInput, name=name, is_training=is_training, seed=seed,
                              batch_size=self.BATCH_SIZE, kind="features",
                              feature_dim=self.FEATURE_DIM, num_classes=self.NUM_CLASSES,
                              eval_num_batches=4)

        return [features("train", True, 1234), features("test", False, 4321)]
