"""Small language models that train on a laptop CPU: the quick start and the tests' models.

Both read the default corpus (the King James Bible, from ``pax-lm[corpus]``) as UTF-8 bytes, so
they need no tokenizer file and no data download; or the user's text (``CORPUS_PATH``), datasets
prepared with the byte tokenizer (``TRAIN_DATA``, ``EVAL_DATA``), conversations to fine-tune
on (``SFT_DATA``, see ``pax_lm.sft``), or preference pairs to tune adapters on (``DPO_DATA``,
see ``pax_lm.dpo``).
"""

from __future__ import annotations

import fiddle as fdl

from pax_core import UsageError
from pax_lm.dpo.dataset import DpoDataset
from pax_lm.dpo.preference_input import PreferenceInput
from pax_lm.experiments.base import (
    ExpertParallel,
    PipelinedExperiment,
    TransformerLmExperiment,
)
from pax_lm.experiments.sizes import size
from pax_lm.inputs.text import TextInput
from pax_lm.inputs.tokens import TokensInput
from pax_lm.sft.chat_input import ChatInput
from pax_lm.tokenizers import ByteTokenizer


class TextCorpusDataset(DpoDataset):
    """Mixin: ``CORPUS_PATH`` (None: the default corpus) tokenized by ``TOKENIZER`` ('bytes', a
    SentencePiece .model or a Hugging Face .json file), packed into rows, with a held-out split
    for eval; or, with ``TRAIN_DATA`` (a prepared dataset, or {path: weight} for a mixture),
    prepared datasets streamed by ``INPUT_WORKERS`` processes, evaluated on all of
    ``EVAL_DATA`` (if given); or, with ``SFT_DATA``, conversations to fine-tune on
    (``SftDataset``); or, with ``DPO_DATA``, preference pairs (``DpoDataset``)."""

    TOKENIZER = "bytes"
    CORPUS_PATH: str | None = None
    EVAL_BATCHES = 4
    TRAIN_DATA: str | dict[str, float] | None = None
    EVAL_DATA: str | None = None
    INPUT_WORKERS = 0

    def datasets(self) -> list[fdl.Config[TextInput] | fdl.Config[TokensInput]
                                | fdl.Config[ChatInput] | fdl.Config[PreferenceInput]]:
        if self.DPO_DATA is not None:
            if any(v is not None for v in (self.SFT_DATA, self.CORPUS_PATH, self.TRAIN_DATA)):
                raise UsageError("give DPO_DATA (preference pairs) alone, without SFT_DATA, "
                                 "CORPUS_PATH or TRAIN_DATA")
            return self.preference_datasets()
        if self.SFT_DATA is not None:
            if self.CORPUS_PATH is not None or self.TRAIN_DATA is not None:
                raise UsageError("give SFT_DATA (conversations) or CORPUS_PATH / TRAIN_DATA "
                                 "(text), not both")
            return self.chat_datasets()
        if self.TRAIN_DATA is not None:
            return self._prepared_datasets()
        common = dict(path=self.CORPUS_PATH, tokenizer=self.tokenizer(),
                      seq_len=self.MAX_SEQ_LEN, batch_size=self.global_batch_size())
        return [
            fdl.Config(TextInput, name="train", split="train", is_training=True, seed=1234,
                       **common),
            fdl.Config(TextInput, name="heldout", split="eval", is_training=False, seed=4321,
                       eval_num_batches=self.EVAL_BATCHES, **common),
        ]

    def _prepared_datasets(self) -> list[fdl.Config[TokensInput]]:
        if self.CORPUS_PATH is not None:
            raise UsageError("give CORPUS_PATH (text) or TRAIN_DATA (prepared datasets), not both")
        common = dict(tokenizer=self.tokenizer(), seq_len=self.MAX_SEQ_LEN,
                      batch_size=self.global_batch_size())
        source = (dict(mixture=dict(self.TRAIN_DATA)) if isinstance(self.TRAIN_DATA, dict)
                  else dict(path=self.TRAIN_DATA))
        train = fdl.Config(TokensInput, name="train", is_training=True, seed=1234,
                           num_workers=self.INPUT_WORKERS, **source, **common)
        if self.EVAL_DATA is None:
            return [train]
        return [train, fdl.Config(TokensInput, name="heldout", path=self.EVAL_DATA,
                                  is_training=False, eval_num_batches=-1, **common)]


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
    PERCORE_BATCH_SIZE = None
    BATCH_SIZE = 8  # a fixed global batch: the quick start learns the same on any devices
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


class QuickStartMoeLm(QuickStartLm):
    """The quick start as a Mixture-of-Experts: each token goes to 2 of 8 experts of 384 units,
    as many weights a token as the dense quick start's feed-forward of 768 (plus a router of
    192 x 8), with four times its feed-forward weights in all. Dropless."""

    NUM_EXPERTS = 8
    NUM_EXPERTS_PER_TOKEN = 2
    MOE_HIDDEN_DIMS = 384


class TinyMoeLmForTests(ExpertParallel, TinyLmForTests):
    """The tests' model with 2 of 4 experts a token in each layer, the experts split over an
    expert axis of 4 (data 2 x expert 4: 8 devices)."""

    NUM_EXPERTS = 4
    NUM_EXPERTS_PER_TOKEN = 2
    MOE_HIDDEN_DIMS = 128
    ICI_MESH_SHAPE = [1, 2, 4, 1]
