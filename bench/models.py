"""The benchmark's larger models, on the quick start's data and settings: a ~25M-parameter
llama-style LM and a ~50M-parameter GPT; and the llama-style LM in a plain configuration (Adam
alone on random tokens).

Loaded by ``pax train --exp bench/models.py:BenchLm50M``, by the bare loop and by the
hand-written baseline's harness alike.
"""

from __future__ import annotations

from pax_lm.experiments.base import SyntheticDataset
from pax_lm.experiments.quickstart import QuickStartLm


class BenchLlama25M(QuickStartLm):
    """4 layers of width 512 (8 heads of 64), RMSNorm, gated SiLU feed-forward 2048, rotary
    positions, an untied 8,192-token vocabulary (bytes use its first 259), sequence 256,
    batch 8: 25.2M parameters."""

    NUM_LAYERS = 4
    MODEL_DIMS = 512
    HIDDEN_DIMS = 2048
    NUM_HEADS = 8
    DIMS_PER_HEAD = 64
    ACTIVATION = "silu"
    USE_GATED_ACTIVATION = True
    NORMALIZATION = "rmsnorm"
    VOCAB_SIZE = 8192
    SEPARATE_EMBEDDING = True
    SCALE_EMBEDDING = False
    MAX_SEQ_LEN = 256
    BATCH_SIZE = 8


class BenchLm50M(QuickStartLm):
    """7 layers of width 768 (12 heads of 64, feed-forward 3072): 49.6M parameters."""

    NUM_LAYERS = 7
    MODEL_DIMS = 768
    HIDDEN_DIMS = 3072
    NUM_HEADS = 12
    DIMS_PER_HEAD = 64
    BATCH_SIZE = 2


class BenchLlama25MPlain(SyntheticDataset, BenchLlama25M):
    """The same model with nothing asked of a step beyond its loss and Adam's update: no
    gradient or update clipping, no weight decay, a constant learning rate, and unpacked random
    tokens (every row one document, every token counted), so that a plain flax + optax loop
    (``handwritten.py``'s plain mode) computes the same thing."""

    CLIP_GRADIENT_NORM_TO_VALUE = 0.0
    ADAM_CLIP_THRESHOLD = 0.0
    WEIGHT_DECAY = 0.0
    LR_SCHEDULE = "constant"
