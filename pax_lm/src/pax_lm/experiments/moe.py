"""Mixture-of-Experts LMs at published sizes: GLaM as Pax's GPU configurations had it, and a
DeepSeek-style fine-grained MoE with shared experts.

Each splits its experts over the ``expert`` mesh axis (``ExpertParallel``) and trains on
synthetic tokens, as Pax's ``lm_cloud`` sizes do: they are for planning (``pax plan``),
measuring and a data mixin of one's own. Parameter counts are the published ones (the tests
check them); where the published model computes something Pax's layers do not, the docstring
says what stands in for it. Mixtral's published sizes are open-weights experiments
(``open_models.py``), built from their ``config.json``.
"""

from __future__ import annotations

from pax_lm.experiments.base import ExpertParallel, SyntheticDataset, TransformerLmExperiment
from pax_lm.experiments.sizes import size


class GlamLm(ExpertParallel, SyntheticDataset, TransformerLmExperiment):
    """GLaM's architecture (Du et al. 2021, as praxis's ``glam.py`` builds it): every other
    layer sparse, each token going to 2 of 64 plain ReLU experts with GShard's capacity factor
    2.0 (praxis's default) and a load-balancing weight of 0.01, the dense layers gated GELU;
    RMS norms, a tied embedding, no biases. GLaM's relative position bias (a few thousand
    weights a layer) is rotary attention here. Pax puts its sparse layer first in each pair and
    this stack last: the same counts and compute."""

    ACTIVATION = "gelu"
    USE_GATED_ACTIVATION = True
    NORMALIZATION = "rmsnorm"
    USE_ROTARY_POSITION_EMB = True
    ATTEN_LOGIT_CAP = 0.0
    SOFTMAX_CAP = 0.0
    NUM_EXPERTS = 64
    NUM_EXPERTS_PER_TOKEN = 2
    EXPERT_CAPACITY_FACTOR = 2.0
    MOE_ACTIVATION = "relu"
    MOE_GATED = False
    MOE_EVERY = 2
    USE_REPEATED_LAYER = True
    CHECKPOINT_POLICY = "SAVE_NOTHING"
    FPROP_DTYPE = "bfloat16"
    MAX_SEQ_LEN = 1024


@size("glam-126m")
class GLaM126M64E(GlamLm):
    """NVIDIA's Pax GLaM 126M/64E: Pax's GPT 126M (12 layers, width 768, 12 heads of 64)
    with 64 experts in every other layer, about 1.9B weights; the experts over 64 devices,
    8 sequences of 2048 each."""

    VOCAB_SIZE = 50304
    MAX_SEQ_LEN = 2048
    PERCORE_BATCH_SIZE = 8
    ICI_MESH_SHAPE = [1, 1, 64, 1]


@size("glam-64b")
class GLaM64B64E(GlamLm):
    """GLaM 64B/64E: 64 layers of width 8192 (128 heads of 128), 1.2T weights of which 96.6B
    a token multiplies, GLaM's 256K vocabulary; the experts over 64 devices and tensor
    parallelism over 8 (512 devices), about a million tokens a step."""

    VOCAB_SIZE = 256000
    PERCORE_BATCH_SIZE = 2
    ICI_MESH_SHAPE = [1, 1, 64, 8]


@size("deepseek-moe-16b")
class DeepSeekMoE16B(ExpertParallel, SyntheticDataset, TransformerLmExperiment):
    """DeepSeekMoE 16B (16.4B weights, 2.8B a token): fine-grained experts, each token going
    to 6 of 64 routed experts of 1408 units (their weights not renormalised) and through 2
    shared ones, every layer but the first (a dense SwiGLU of 10944); 28 layers of width 2048
    with 16 heads of 128, RMS norms, rotary positions, an untied head. Dropless, with
    DeepSeek's load-balancing weight of 0.001. Experts over 8 devices of the expert axis, FSDP
    over 8 of data (64 devices)."""

    VOCAB_SIZE = 102400
    MAX_SEQ_LEN = 4096
    ACTIVATION = "silu"
    USE_GATED_ACTIVATION = True
    NORMALIZATION = "rmsnorm"
    USE_ROTARY_POSITION_EMB = True
    SEPARATE_EMBEDDING = True
    SCALE_EMBEDDING = False
    ATTEN_LOGIT_CAP = 0.0
    SOFTMAX_CAP = 0.0
    NUM_EXPERTS = 64
    NUM_EXPERTS_PER_TOKEN = 6
    MOE_HIDDEN_DIMS = 1408
    NUM_SHARED_EXPERTS = 2
    NORMALIZE_EXPERT_WEIGHTS = False
    FIRST_DENSE_LAYERS = 1
    MOE_LOAD_BALANCING_WEIGHT = 0.001
    USE_REPEATED_LAYER = True
    CHECKPOINT_POLICY = "SAVE_NOTHING"
    FPROP_DTYPE = "bfloat16"
    PERCORE_BATCH_SIZE = 1
    ICI_MESH_SHAPE = [1, 8, 8, 1]
