"""Speed benchmarks on one accelerator chip: llama-style decoders on random tokens, the models
``bench/tpu_train.py`` trains against a hand-written JAX loop on a TPU v5e.

Llama's shape (RMSNorm, rotary, gated SiLU, untied embeddings, no biases or logit caps), bf16
compute over float32 weights, scanned layers, and an optimizer with nothing beyond its update
rule (no clipping, decay or schedule), so that the two programs compute the same thing.
"""

from __future__ import annotations

from pax_lm.experiments.base import SyntheticDataset, TransformerLmExperiment
from pax_lm.experiments.sizes import size


class LlamaBenchmark(SyntheticDataset, TransformerLmExperiment):
    """The benchmarks' shared settings; one chip, 8 sequences of 2,048 tokens a step."""

    VOCAB_SIZE = 32768
    MAX_SEQ_LEN = 2048
    PERCORE_BATCH_SIZE = 8
    ICI_MESH_SHAPE = [1, 1, 1]
    USE_ROTARY_POSITION_EMB = True
    ACTIVATION = "silu"
    USE_GATED_ACTIVATION = True
    NORMALIZATION = "rmsnorm"
    SEPARATE_EMBEDDING = True
    SCALE_EMBEDDING = False
    ATTEN_LOGIT_CAP = 0.0
    SOFTMAX_CAP = 0.0
    USE_REPEATED_LAYER = True
    FPROP_DTYPE = "bfloat16"
    LEARNING_RATE = 3e-4
    ADAM_BETA2 = 0.95
    ADAM_CLIP_THRESHOLD = 0.0
    WEIGHT_DECAY = 0.0
    CLIP_GRADIENT_NORM_TO_VALUE = 0.0
    LR_SCHEDULE = "constant"
    NUM_TRAIN_STEPS = 100
    SUMMARY_INTERVAL_STEPS = 10


@size("bench-24x1024")
class LlamaBench470M(LlamaBenchmark):
    """470M weights (24 layers of 1,024, 16 heads of 64, MLP 4,096), Adam."""


@size("bench-16x2048")
class LlamaBench1B(LlamaBenchmark):
    """1.2B weights (16 layers of 2,048, 16 heads of 128, MLP 8,192), Adafactor, whose
    factored second moments leave room for the activations on a 16 GiB chip."""

    OPTIMIZER = "adafactor"
    ADAFACTOR_BETA1 = 0.0
