"""Pax's c4_multislice family: 22B and 32B models over one to four slices.

Sizes follow MaxText's "MaxText to Pax" table as Pax registered them
(``paxml/tasks/lm/params/c4_multislice.py``): the ``data`` axis acts as FSDP inside a slice and
``replica`` as data parallelism across slices (the DCN mesh).
"""

from __future__ import annotations

from pax_lm.experiments.c4 import C4SpmdAdam, C4SpmdGpt3AdamOrgHP
from pax_lm.experiments.sizes import size


@size("maxtext-22B")
class C4Spmd22BAdamMaxText(C4SpmdAdam):
    VOCAB_SIZE = 32768
    PERCORE_BATCH_SIZE = 16
    DCN_MESH_SHAPE = [1, 1, 1]
    FPROP_DTYPE = "bfloat16"
    USE_REPEATED_LAYER = True
    CHECKPOINT_POLICY = "SAVE_NOTHING"
    SUMMARY_INTERVAL_STEPS = 10


class C4Spmd22BAdam1xv4_128(C4Spmd22BAdamMaxText):
    ICI_MESH_SHAPE = [1, 64, 1]


class C4Spmd22BAdam2xv4_128(C4Spmd22BAdam1xv4_128):
    DCN_MESH_SHAPE = [2, 1, 1]


class C4Spmd22BAdam4xv4_128(C4Spmd22BAdam1xv4_128):
    DCN_MESH_SHAPE = [4, 1, 1]


@size("maxtext-22B-wide")
class C4Spmd22BAdam1xv4_384(C4Spmd22BAdamMaxText):
    PERCORE_BATCH_SIZE = 10
    ICI_MESH_SHAPE = [1, 192, 1]


class C4Spmd22BAdam2xv4_384(C4Spmd22BAdam1xv4_384):
    DCN_MESH_SHAPE = [2, 1, 1]


@size("maxtext-v4-8")
class C4Spmd22BAdam1xv4_8(C4Spmd22BAdamMaxText):
    ICI_MESH_SHAPE = [1, 4, 1]


class C4Spmd22BAdam2xv4_8(C4Spmd22BAdam1xv4_8):
    DCN_MESH_SHAPE = [2, 1, 1]


class C4Spmd22BAdam4xv4_8(C4Spmd22BAdam1xv4_8):
    DCN_MESH_SHAPE = [4, 1, 1]


@size("maxtext-32B")
class C4Spmd32BAdam1xv5_256(C4Spmd22BAdamMaxText):
    """32B on a v5 slice of 128 chips, sequence 2048 (global batch 256; Pax's docstring says
    2048)."""

    MAX_SEQ_LEN = 2048
    PERCORE_BATCH_SIZE = 2
    ICI_MESH_SHAPE = [1, 128, 1]


class C4Spmd32BAdam2xv5_256(C4Spmd32BAdam1xv5_256):
    DCN_MESH_SHAPE = [2, 1, 1]


class C4SpmdGpt3AdamDataParallel2x16x16(C4SpmdGpt3AdamOrgHP):
    """GPT-3 175B over two slices of 16x16, bf16, 100 steps."""

    PERCORE_BATCH_SIZE = 0.5
    ICI_MESH_SHAPE = [1, 16, 16]
    DCN_MESH_SHAPE = [2, 1, 1]
    FPROP_DTYPE = "bfloat16"
    NUM_TRAIN_STEPS = 100
    CHECKPOINT_EVERY_N_STEPS = 2000


class C4Spmd22BAdam1xv4_128LimitSteps(C4Spmd22BAdam1xv4_128):
    NUM_TRAIN_STEPS = 300


class C4Spmd22BAdam2xv4_128LimitSteps(C4Spmd22BAdam2xv4_128):
    NUM_TRAIN_STEPS = 300


class C4Spmd22BAdam4xv4_128LimitSteps(C4Spmd22BAdam4xv4_128):
    NUM_TRAIN_STEPS = 300


class C4Spmd22BAdam1xv4_8LimitSteps(C4Spmd22BAdam1xv4_8):
    NUM_TRAIN_STEPS = 300


class C4Spmd22BAdam2xv4_8LimitSteps(C4Spmd22BAdam2xv4_8):
    NUM_TRAIN_STEPS = 300


class C4Spmd22BAdam4xv4_8LimitSteps(C4Spmd22BAdam4xv4_8):
    NUM_TRAIN_STEPS = 300
