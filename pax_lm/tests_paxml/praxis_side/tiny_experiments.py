"""Tiny paxml 1.4 language models, trained by paxml itself, whose checkpoints ``pax import
paxml`` must read.

Each experiment is paxml's own ``c4.TransformerLmSpmdAdam`` (the base of its
``LmCloudSpmdAdam``) with tiny dimensions, so the checkpoint is exactly what paxml's SPMD
trainer writes for a real configuration; only sizes, schedule and data change. The three
variants cover the layouts an importer has to tell apart: separate layers or layers stacked
under praxis's ``Repeat``, a tied or a separate embedding, plain or gated feed-forward, with or
without rotary attention.

The module runs only in a paxml 1.4 environment (Python 3.10), e.g.::

    PYTHONPATH=pax_lm/tests_paxml/praxis_side python -m paxml.main \\
        --exp=tiny_experiments.TinyLm --job_log_dir=JOB --mode=train
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from paxml import experiment_registry, tasks_lib
from paxml.tasks.lm.params import c4
from praxis import base_input, layers, pax_fiddle, py_utils

NestedMap = py_utils.NestedMap


class RandomTokenLmInput(base_input.BaseInput):
    """Uniformly random token ids, unpacked and unpadded, in the layout paxml's
    ``LanguageModel`` reads.

    paxml's own synthetic LM input emits only ones, which leaves most of the embedding
    untrained; random ids move every row, so a wrongly oriented or wrongly scaled embedding
    shows in the logits.
    """

    seq_len: int = 16
    vocab_size: int = 64
    _rng: Any = dataclasses.field(init=False, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._rng = np.random.default_rng(self.input_random_seed)

    def get_next(self) -> NestedMap:
        b, t = self.batch_size, self.seq_len
        tokens = self._rng.integers(1, self.vocab_size, size=(b, t + 1), dtype=np.int32)
        return NestedMap(
            ids=tokens[:, :-1],
            labels=tokens[:, 1:],
            paddings=np.zeros((b, t), np.float32),
            weights=np.ones((b, t), np.float32),
            segment_ids=np.ones((b, t), np.int32),
            segment_pos=np.tile(np.arange(t, dtype=np.int32), (b, 1)),
        )

    def reset(self) -> None:
        super().reset()
        self._rng = np.random.default_rng(self.input_random_seed)


class _Tiny(c4.TransformerLmSpmdAdam):
    """Sizes, schedule and data shared by every variant: one CPU device, 40 steps, one
    checkpoint at the end (paxml also writes step 0), no evaluation."""

    NUM_LAYERS = 2
    MODEL_DIMS = 32
    HIDDEN_DIMS = 64
    NUM_HEADS = 4
    DIMS_PER_HEAD = 8
    VOCAB_SIZE = 64
    ICI_MESH_SHAPE = [1, 1, 1]

    PERCORE_BATCH_SIZE = 4
    MAX_SEQ_LEN = 16

    # A large rate with a short warmup moves every weight well away from its initial value
    # (LayerNorm scales, PerDimScale, the softmax bias), so that a convention the importer gets
    # wrong changes the logits by far more than float32 round-off.
    LEARNING_RATE = 2e-2
    LR_LRED_WARMUP = 2
    LR_LRED_DECAY_START = 3
    LR_LRED_DECAY_END = 1000

    NUM_TRAIN_STEPS = 40
    CHECKPOINT_EVERY_N_STEPS = 40
    SUMMARY_INTERVAL_STEPS = 40
    EVAL_INTERVAL_STEPS = 0

    def task(self) -> pax_fiddle.Config[tasks_lib.SingleTask]:
        task_p = super().task()
        train_p = task_p.train
        train_p.num_train_steps = self.NUM_TRAIN_STEPS
        # Evaluation and per-variable norms only cost time here: the test reads the checkpoint.
        train_p.eval_skip_train = True
        train_p.variable_norm_summary = False
        return task_p

    def datasets(self) -> list[pax_fiddle.Config[base_input.BaseInput]]:
        return [
            pax_fiddle.Config(
                RandomTokenLmInput,
                name="train",
                batch_size=self.PERCORE_BATCH_SIZE,
                seq_len=self.MAX_SEQ_LEN,
                vocab_size=self.VOCAB_SIZE,
                is_training=True,
                input_random_seed=1234,
            )
        ]


@experiment_registry.register
class TinyLm(_Tiny):
    """``LmCloudSpmdAdam``'s architecture: GELU, not gated, the sinusoidal position embedding,
    the embedding tied to the softmax, one set of weights per layer."""

    ACTIVATION_CLS = layers.GELU
    USE_GATED_ACTIVATION = False
    USE_REPEATED_LAYER = False


@experiment_registry.register
class TinyLmRotaryGated(_Tiny):
    """Rotary attention and a gated SiLU feed-forward.

    As in every paxml configuration, ``USE_ROTARY_POSITION_EMB`` only turns on the attention's
    rotary embedding: the language model keeps its sinusoidal position embedding too, and an
    importer has to reproduce both.
    """

    ACTIVATION_CLS = layers.SiLU
    USE_GATED_ACTIVATION = True
    USE_ROTARY_POSITION_EMB = True
    USE_REPEATED_LAYER = False


@experiment_registry.register
class TinyLmRepeatedSeparate(_Tiny):
    """Layers stacked under praxis's ``Repeat`` (one array per weight with a leading layer axis)
    and an embedding table of its own, separate from the softmax (which keeps its bias); ReLU,
    paxml's default, not gated; the sinusoidal position embedding and no rotary."""

    USE_REPEATED_LAYER = True
    SEPARATE_EMBEDDING = True
