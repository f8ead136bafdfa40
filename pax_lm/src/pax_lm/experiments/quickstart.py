"""Small language models that train on a laptop CPU: the quick start and the tests' models.

Both read the default corpus (the King James Bible, from ``pax-lm[corpus]``) as UTF-8 bytes, so
they need no tokenizer file and no data download.
"""

from __future__ import annotations

import fiddle as fdl

from pax_lm.experiments.base import PipelinedExperiment, TransformerLmExperiment
from pax_lm.experiments.sizes import size
from pax_lm.inputs.text import TextInput
from pax_lm.tokenizers import ByteTokenizer


class TextCorpusDataset:
    """Mixin: ``CORPUS_PATH`` (None: the default corpus) as bytes, packed into rows, with a
    held-out split for eval."""

    CORPUS_PATH: str | None = None
    EVAL_BATCHES = 4

    def datasets(self) -> list[fdl.Config[TextInput]]:
        common = dict(path=self.CORPUS_PATH, tokenizer=fdl.Config(ByteTokenizer),
                      seq_len=self.MAX_SEQ_LEN, batch_size=self.global_batch_size())
        return [
            fdl.Config(TextInput, name="train", split="train", is_training=True, seed=1234,
                       **common),
            fdl.Config(TextInput, name="heldout", split="eval", is_training=False, seed=4321,
                       eval_num_batches=self.EVAL_BATCHES, **common),
        ]


@size("quickstart")
class QuickStartLm(TextCorpusDataset, TransformerLmExperiment):
    """A 1.8M-parameter GPT (4 layers, width 192, rotary positions) on the King James Bible.

    About 5 steps per second on two CPU cores (two minutes in all); the loss falls from 5.5
    (uniform over bytes) to about 1.5 within the run. Then
    ``pax decode --job-dir DIR --prompt "In the beginning"`` continues text.
    """

    VOCAB_SIZE = ByteTokenizer.vocab_size
    MAX_SEQ_LEN = 128
    ACTIVATION = "gelu"
    USE_ROTARY_POSITION_EMB = True
    ATTEN_LOGIT_CAP = 0.0
    SOFTMAX_CAP = 0.0
    FPROP_DTYPE = "float32"
    CHECKPOINT_POLICY = None
    ICI_MESH_SHAPE = None
    PERCORE_BATCH_SIZE = 8
    LEARNING_RATE = 3e-3
    WEIGHT_DECAY = 1e-2
    CLIP_GRADIENT_NORM_TO_VALUE = 1.0
    LR_SCHEDULE = "linear_rampup_cosine_decay"
    LR_COS_WARMUP = 50
    LR_COS_DECAY_START = 50
    LR_COS_DECAY_END = 600
    NUM_TRAIN_STEPS = 600
    SUMMARY_INTERVAL_STEPS = 50
    EVAL_INTERVAL_STEPS = 200
    CHECKPOINT_EVERY_N_STEPS = 200
    CHECKPOINT_MAX_TO_KEEP = 2

    def global_batch_size(self) -> int:
        """A fixed global batch, so the quick start learns the same on any number of devices."""
        return self.PERCORE_BATCH_SIZE


@size("tiny")
class TinyLmForTests(QuickStartLm):
    """The smallest LM that visibly learns: for tests and examples."""

    MAX_SEQ_LEN = 32
    LR_COS_WARMUP = 5
    LR_COS_DECAY_START = 5
    LR_COS_DECAY_END = 60
    NUM_TRAIN_STEPS = 60
    SUMMARY_INTERVAL_STEPS = 10
    EVAL_INTERVAL_STEPS = 30
    CHECKPOINT_EVERY_N_STEPS = 30
    EVAL_BATCHES = 2


class TinyPipelinedLmForTests(PipelinedExperiment, TinyLmForTests):
    """The tests' model with 4 layers as a GPipe pipeline: 2 stages of 2 layers, each stage over
    data 2 x mdl 2 (8 devices), 4 microbatches of 2 (needs pax-pipeline)."""

    NUM_LAYERS = 4
    ICI_MESH_SHAPE = [2, 1, 2, 2]
    NUM_STAGES = 2
    NUM_MICROBATCHES = 4

