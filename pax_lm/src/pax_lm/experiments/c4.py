"""Pax's c4 family: real C4 data, Adam at 1e-3, and the GPT-3 sets.

Names, sizes, meshes and schedules are Pax's (``paxml/tasks/lm/params/c4.py``). The data is read
from where the user keeps C4 (``--set C4_DATA_DIR=...`` and ``--set C4_SPM_MODEL=...``); see
``pax_lm.inputs.c4``.
"""

from __future__ import annotations

import math

import fiddle as fdl

from pax_core import UsageError
from pax_lm.experiments.base import PipelinedExperiment, SyntheticDataset, TransformerLmExperiment
from pax_lm.experiments.sizes import size
from pax_lm.inputs.c4 import C4Input


class C4UnsupervisedDataset:
    """Mixin: C4 train (concatenated and split, seed 9876, read by ``INPUT_WORKERS``
    processes) and validation (seed 4321, every document once), tokenized with Pax's C4
    SentencePiece model."""

    C4_DATA_DIR: str | None = None
    C4_SPM_MODEL: str | None = None
    INPUT_WORKERS = 1

    def datasets(self) -> list[fdl.Config[C4Input]]:
        common = dict(data_dir=self.C4_DATA_DIR, spm_model=self.C4_SPM_MODEL,
                      seq_len=self.MAX_SEQ_LEN)
        return [
            fdl.Config(C4Input, name="train", c4_split="train", is_training=True, seed=9876,
                       batch_size=self.global_batch_size(), num_workers=self.INPUT_WORKERS,
                       **common),
            fdl.Config(C4Input, name="validation", c4_split="validation", is_training=False,
                       seed=4321, batch_size=self.global_batch_size(), eval_num_batches=-1,
                       **common),
        ]


@size("c4-1024x32")
class TransformerLmSpmdAdam(TransformerLmExperiment):
    """The c4 model mixin: 32 layers, 16 heads, width 1024, fp32; Adam at 1e-3."""

    FPROP_DTYPE = "float32"
    LEARNING_RATE = 1e-3


@size("c4-base")
class C4SpmdAdam(C4UnsupervisedDataset, TransformerLmSpmdAdam):
    """Base of the c4 experiments: 24 layers, width 2048, GELU, checkpoints every 1000 steps."""

    VOCAB_SIZE = 32128
    ACTIVATION = "gelu"
    CHECKPOINT_POLICY = "SAVE_DOT_FOR_MLPERF_200B"
    CHECKPOINT_EVERY_N_STEPS = 1000
    PERCORE_BATCH_SIZE = 1
    ICI_MESH_SHAPE = [1, 4, 2]


@size("1B")
class C4Spmd1BAdam4Replicas(C4SpmdAdam):
    """1B on a v4-8 (4 chips), global batch 128."""

    VOCAB_SIZE = 32000
    PERCORE_BATCH_SIZE = 32
    ICI_MESH_SHAPE = [1, 4, 1]
    FPROP_DTYPE = "bfloat16"
    USE_REPEATED_LAYER = True
    CHECKPOINT_POLICY = "SAVE_NOTHING"
    SUMMARY_INTERVAL_STEPS = 10


@size("2B")
class C4Spmd2BAdam4Replicas(C4Spmd1BAdam4Replicas):
    """Pax's 2B size."""

@size("16B")
class C4Spmd16BAdam32Replicas(C4Spmd1BAdam4Replicas):
    """16B on a v4-64 (32 chips), global batch 512."""

    PERCORE_BATCH_SIZE = 16
    ICI_MESH_SHAPE = [1, 16, 2]


@size("32B")
class C4Spmd32BAdam64Replicas(C4Spmd1BAdam4Replicas):
    """32B on 64 chips, global batch 512."""

    PERCORE_BATCH_SIZE = 8
    ICI_MESH_SHAPE = [1, 16, 4]


class C4Spmd1BAdam4ReplicasLimitSteps(C4Spmd1BAdam4Replicas):
    NUM_TRAIN_STEPS = 15000


class C4Spmd2BAdam4ReplicasLimitSteps(C4Spmd2BAdam4Replicas):
    """15000 steps, as the 1B LimitSteps variant."""

    NUM_TRAIN_STEPS = 15000


class C4Spmd16BAdam32ReplicasLimitSteps(C4Spmd16BAdam32Replicas):
    """15000 steps, as the 1B LimitSteps variant."""

    NUM_TRAIN_STEPS = 15000


class C4Spmd32BAdam64ReplicasLimitSteps(C4Spmd32BAdam64Replicas):
    """15000 steps, as the 1B LimitSteps variant."""

    NUM_TRAIN_STEPS = 15000


@size("c4-2layer")
class LmCloudSpmdAdam(SyntheticDataset, TransformerLmSpmdAdam):
    """A 2-layer, 2048-wide model on synthetic data over a [1, 4, 2] mesh."""

    PERCORE_BATCH_SIZE = 1
    ICI_MESH_SHAPE = [1, 4, 2]


class LmCloudSpmdAdamLimitSteps(LmCloudSpmdAdam):
    NUM_TRAIN_STEPS = 4000


@size("gpt3-175B")
class C4SpmdGpt3AdamOrgHP(C4SpmdAdam):
    """GPT-3 175B with its original hyper-parameters (not registered itself).

    As in Pax, these runs stop early once eval log-perplexity reaches 2.69
    (``EARLY_STOP_TARGET``, Pax's ``TARGET_LOG_PPLX``).
    """

    VOCAB_SIZE = 50257
    MAX_SEQ_LEN = 2048
    TRAINABLE_POSITION_EMB = True
    TRAINABLE_PE_MAX_SEQ_LEN = 16384
    ACTIVATION = "gelu_tanh"
    ATTEN_LOGIT_CAP = 0.0
    SOFTMAX_CAP = 0.0
    USE_BIAS = True
    SCALE_EMBEDDING = False
    INIT_STD = 0.006
    NORM_EPSILON = 1e-5
    LEARNING_RATE = 6e-5
    ADAM_BETA2 = 0.95
    ADAM_EPSILON = 1e-8
    ADAM_CLIP_THRESHOLD = 0.0
    CLIP_GRADIENT_NORM_TO_VALUE = 1.0
    WEIGHT_DECAY = 0.1
    LR_SCHEDULE = "linear_rampup_cosine_decay"
    LR_COS_WARMUP = 265
    LR_COS_DECAY_START = 266
    LR_COS_DECAY_END = 108600
    LR_COS_MIN_RATIO = 0.1
    CHECKPOINT_POLICY = "SAVE_NOTHING"
    USE_REPEATED_LAYER = True
    EVAL_INTERVAL_STEPS = 100
    SUMMARY_INTERVAL_STEPS = 10
    CHECKPOINT_EVERY_N_STEPS = 100
    CHECKPOINT_MAX_TO_KEEP = 10
    EARLY_STOP_TARGET = 2.69


class C4SpmdGpt3AdamOrgHPBS1p5k1536Replicas(C4SpmdGpt3AdamOrgHP):
    PERCORE_BATCH_SIZE = 1
    ICI_MESH_SHAPE = [1, 64, 24]
    VOCAB_SIZE = 51200
    CHECKPOINT_MAX_TO_KEEP = 100
    EVAL_INTERVAL_STEPS = 25
    SUMMARY_INTERVAL_STEPS = 1


class C4SpmdGpt3L16AdamOrgHP(C4SpmdGpt3AdamOrgHP):
    NUM_LAYERS = 16
    PERCORE_BATCH_SIZE = 3
    ICI_MESH_SHAPE = [1, 16, 4]
    FPROP_DTYPE = "bfloat16"
    EVAL_INTERVAL_STEPS = 25000


class C4SpmdPipelineGpt3AdamOrgHP(PipelinedExperiment, C4SpmdGpt3AdamOrgHP):
    """The pipelined GPT-3 sets: not repeated layers, microbatches of 2 by default."""

    USE_REPEATED_LAYER = False
    MICROBATCH_SIZE = 2
    ICI_MESH_SHAPE = [1, 1, 1, 1]
    DCN_MESH_SHAPE = [1, 1, 1, 1]


class C4SpmdPipelineGpt3AdamOrgHPBS1p5k768Replicas(C4SpmdPipelineGpt3AdamOrgHP):
    """Pax sets ``MICROBATCH_SIAZE = 8`` (a typo), so the inherited microbatch size 2 is what
    ran; the effective value is kept."""

    PERCORE_BATCH_SIZE = 2
    NUM_STAGES = 8
    ICI_MESH_SHAPE = [8, 1, 8, 12]
    VOCAB_SIZE = 51200
    CHECKPOINT_MAX_TO_KEEP = 100
    EVAL_INTERVAL_STEPS = 25
    CHECKPOINT_EVERY_N_STEPS = 50


class C4SpmdPipelineGpt3AdamMLPerfHP(C4SpmdPipelineGpt3AdamOrgHP):
    """MLPerf hyper-parameters: learning rate and schedule follow the global batch.

    Each of the four constants left None takes MLPerf's value for the global batch; one the
    user sets (``--set LEARNING_RATE=...``) is kept."""

    VOCAB_SIZE = 51200
    SUMMARY_INTERVAL_STEPS = 1
    CHECKPOINT_MAX_TO_KEEP = 100
    LEARNING_RATE: float | None = None  # 2e-5 up to a global batch of 3584, else 3e-5
    LR_COS_WARMUP: int | None = None  # 265 steps at a batch of 1536, scaled
    LR_COS_DECAY_START: int | None = None  # the step after the warm-up
    LR_COS_DECAY_END: int | None = None  # 108600 steps at a batch of 1536, scaled

    def derive_constants(self) -> None:
        batch = self.global_batch_size()
        if batch > 8192:
            raise UsageError(f"MLPerf GPT-3 hyper-parameters are defined up to a global batch "
                             f"of 8192, not {batch}")
        if self.LEARNING_RATE is None:
            self.LEARNING_RATE = 2e-5 if batch <= 3584 else 3e-5
        if self.LR_COS_WARMUP is None:
            self.LR_COS_WARMUP = math.ceil(265 * 1536 / batch)
        if self.LR_COS_DECAY_START is None:
            self.LR_COS_DECAY_START = self.LR_COS_WARMUP + 1
        if self.LR_COS_DECAY_END is None:
            self.LR_COS_DECAY_END = math.ceil(108600 * 1536 / batch)
        super().derive_constants()


class C4SpmdPipelineGpt3AdamMLPerfHPBS1p5k768Replicas(C4SpmdPipelineGpt3AdamMLPerfHP):
    PERCORE_BATCH_SIZE = 2
    NUM_STAGES = 8
    ICI_MESH_SHAPE = [8, 1, 8, 12]
    MICROBATCH_SIZE = 8
    EVAL_INTERVAL_STEPS = 16
    CHECKPOINT_EVERY_N_STEPS = 32
    STREAM_IO = False


class C4SpmdPipelineGpt3AdamMLPerfHPBS2k512Replicas(C4SpmdPipelineGpt3AdamMLPerfHP):
    PERCORE_BATCH_SIZE = 4
    NUM_STAGES = 8
    ICI_MESH_SHAPE = [8, 1, 8, 8]
    MICROBATCH_SIZE = 8
    EVAL_INTERVAL_STEPS = 12
    CHECKPOINT_EVERY_N_STEPS = 24
    STREAM_IO = True


class C4SpmdPipelineGpt3AdamMLPerfHPBS3k768Replicas(C4SpmdPipelineGpt3AdamMLPerfHP):
    PERCORE_BATCH_SIZE = 4
    NUM_STAGES = 4
    ICI_MESH_SHAPE = [4, 1, 16, 12]
    MICROBATCH_SIZE = 16
    EVAL_INTERVAL_STEPS = 8
    CHECKPOINT_EVERY_N_STEPS = 16


class C4SpmdPipelineGpt3AdamMLPerfHPBS4k1024Replicas(C4SpmdPipelineGpt3AdamMLPerfHP):
    PERCORE_BATCH_SIZE = 4
    NUM_STAGES = 8
    ICI_MESH_SHAPE = [8, 1, 8, 16]
    MICROBATCH_SIZE = 8
    EVAL_INTERVAL_STEPS = 6
    CHECKPOINT_EVERY_N_STEPS = 12


class C4SpmdPipelineGpt3AdamMLPerfHPBS8k1024Replicas(C4SpmdPipelineGpt3AdamMLPerfHP):
    PERCORE_BATCH_SIZE = 8
    NUM_STAGES = 4
    ICI_MESH_SHAPE = [4, 1, 16, 16]
    MICROBATCH_SIZE = 16
    EVAL_INTERVAL_STEPS = 3
    CHECKPOINT_EVERY_N_STEPS = 6


@size("gpt3-24x3072")
class C4SpmdPipelineGpt3SmallAdam8Replicas(C4SpmdPipelineGpt3AdamOrgHP):
    """GPT-3 XL (1.3B) on 8 chips, 2 stages, 64 microbatches of 8.

    Pax's README still names its predecessor, ``C4SpmdPipelineGpt3SmallAdam64Replicas``
    (renamed in March 2023); that name is kept as an alias of this class.
    """

    VOCAB_SIZE = 51200
    PERCORE_BATCH_SIZE = 64
    NUM_STAGES = 2
    ICI_MESH_SHAPE = [2, 1, 2, 2]
    MICROBATCH_SIZE = 8
    FPROP_DTYPE = "bfloat16"
    LEARNING_RATE = 2e-4
    CHECKPOINT_MAX_TO_KEEP = 1000
    EVAL_INTERVAL_STEPS = 10
    SUMMARY_INTERVAL_STEPS = 5
    CHECKPOINT_EVERY_N_STEPS = 200
