"""The test plugin's experiment."""

from __future__ import annotations

import fiddle as fdl

from pax_core import Adam, Experiment, Learner, LinearRampupExponentialDecay, Task, Train
from pax_testplugin.inputs import CountingInput
from pax_testplugin.models import TinyLm


class TinyCounting(Experiment):
    VOCAB_SIZE = 32
    DIM = 32
    SEQ_LEN = 16
    BATCH_SIZE = 16
    NUM_TRAIN_STEPS = 60
    LEARNING_RATE = 1e-2

    def task(self) -> fdl.Config[Task]:
        warmup = max(1, self.NUM_TRAIN_STEPS // 10)
        schedule = fdl.Config(LinearRampupExponentialDecay, warmup_steps=warmup,
                              decay_start=warmup, decay_end=self.NUM_TRAIN_STEPS, min_ratio=0.1)
        return fdl.Config(
            Task,
            model=fdl.Config(TinyLm, vocab_size=self.VOCAB_SIZE, dim=self.DIM),
            train=fdl.Config(
                Train,
                learner=fdl.Config(Learner, optimizer=fdl.Config(
                    Adam, learning_rate=self.LEARNING_RATE, lr_schedule=schedule,
                    clip_gradient_norm_to_value=5.0)),
                num_train_steps=self.NUM_TRAIN_STEPS,
                save_interval_steps=20,
                save_max_to_keep=2,
                summary_interval_steps=10,
                eval_interval_steps=30,
            ),
        )

    def datasets(self) -> list[fdl.Config[CountingInput]]:
        common = dict(batch_size=self.BATCH_SIZE, seq_len=self.SEQ_LEN,
                      vocab_size=self.VOCAB_SIZE)
        return [
            fdl.Config(CountingInput, name="train", is_training=True, seed=1, **common),
            fdl.Config(CountingInput, name="test", is_training=False, seed=2,
                       eval_num_batches=2, **common),
        ]
