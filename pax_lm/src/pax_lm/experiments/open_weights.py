"""Open-weights decoders (Llama, Mistral, Mixtral, Qwen, Gemma, GPT-2, GPT-NeoX, Phi) trained on.

``OpenWeightsLm`` is what ``pax import hf`` makes a job of: its architecture constants come
from the source's ``config.json`` (recorded as the job's overrides, so ``pax train``, ``pax
eval`` and ``pax decode`` rebuild the same model), and its defaults are those of continued
training rather than of a run from scratch: a small learning rate with a short warm-up, no
weight decay, the weights in float32 and the compute in the checkpoint's dtype. It reads the
user's text (``CORPUS_PATH``), prepared datasets (``TRAIN_DATA``, prepared with the model's
tokenizer) or conversations (``SFT_DATA``, written with the model's chat template), else the
default corpus, through the model's own tokenizer (``TOKENIZER``, the job's copy); with
``LORA_RANK`` it trains low-rank adapters alone.
"""

from __future__ import annotations

from pax_lm.experiments.base import TransformerLmExperiment
from pax_lm.experiments.quickstart import TextCorpusDataset


class OpenWeightsLm(TextCorpusDataset, TransformerLmExperiment):
    """An imported open-weights decoder, continued on text; ``pax import hf`` sets its
    architecture."""

    FPROP_DTYPE = "bfloat16"
    CHECKPOINT_POLICY = None
    ATTEN_LOGIT_CAP = 0.0
    SOFTMAX_CAP = 0.0
    ICI_MESH_SHAPE = None
    PERCORE_BATCH_SIZE = None
    BATCH_SIZE = 8
    MAX_SEQ_LEN = 512
    LEARNING_RATE = 1e-5
    WEIGHT_DECAY = 0.0
    CLIP_GRADIENT_NORM_TO_VALUE = 1.0
    LR_SCHEDULE = "linear_rampup_cosine_decay"
    LR_COS_WARMUP = 10
    LR_COS_DECAY_START = 10
    LR_COS_DECAY_END = 1000
    NUM_TRAIN_STEPS = 1000
    SUMMARY_INTERVAL_STEPS = 10
    EVAL_INTERVAL_STEPS = 100
    CHECKPOINT_EVERY_N_STEPS = 100
    CHECKPOINT_MAX_TO_KEEP = 2
