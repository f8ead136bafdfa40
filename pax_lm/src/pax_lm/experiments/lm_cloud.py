"""Pax's lm_cloud family: synthetic data, sequence 1024, vocabulary 32000.

Names, sizes, meshes and schedules are Pax's (``paxml/tasks/lm/params/lm_cloud.py``).
"""

from __future__ import annotations

from pax_lm.experiments.base import PipelinedExperiment, SyntheticDataset, TransformerLmExperiment


class LmCloudTransformerAdam(SyntheticDataset, TransformerLmExperiment):
    """32-layer, 1024-wide model on Pax's data-parallel (pmap) path, Adam at 1e-3."""

    NUM_LAYERS = 32
    MODEL_DIMS = 1024
    HIDDEN_DIMS = 4096
    NUM_HEADS = 16
    DIMS_PER_HEAD = 64
    PERCORE_BATCH_SIZE = 16
    ICI_MESH_SHAPE = None
    LEARNING_RATE = 1e-3
    FPROP_DTYPE = "float32"
    CHECKPOINT_POLICY = None


class LmCloudTransformerAdamTest(LmCloudTransformerAdam):
    NUM_LAYERS = 2


class LmCloudTransformerAdamLimitSteps(LmCloudTransformerAdam):
    """Pax's README example for the pmap path (run there with --pmap_use_tensorstore)."""

    NUM_LAYERS = 10
    NUM_TRAIN_STEPS = 2000


class LmCloudSpmd(SyntheticDataset, TransformerLmExperiment):
    """Base of the SPMD family: GELU, repeated (scanned) layers, bf16, Adam at 2.5e-4."""

    NUM_LAYERS = 10
    MODEL_DIMS = 2048
    HIDDEN_DIMS = 8192
    NUM_HEADS = 16
    DIMS_PER_HEAD = 128
    ACTIVATION = "gelu"
    USE_REPEATED_LAYER = True
    PERCORE_BATCH_SIZE = 16
    ICI_MESH_SHAPE = [1, 1, 1]
    DCN_MESH_SHAPE = [1, 1, 1]


class LmCloudSpmdTest(LmCloudSpmd):
    """The CPU test size."""

    NUM_LAYERS = 2
    MODEL_DIMS = 64
    HIDDEN_DIMS = 256
    NUM_HEADS = 8
    DIMS_PER_HEAD = 8
    PERCORE_BATCH_SIZE = 4


class LmCloudSpmd2B(LmCloudSpmd):
    """2B on 4 chips (global batch 32; Pax's docstring says 128)."""

    NUM_LAYERS = 18
    MODEL_DIMS = 3072
    HIDDEN_DIMS = 12288
    NUM_HEADS = 24
    PERCORE_BATCH_SIZE = 8
    ICI_MESH_SHAPE = [1, 4, 1]


class LmCloudSpmd2BLimitSteps(LmCloudSpmd2B):
    """Pax's README "pjit" example."""

    NUM_TRAIN_STEPS = 300


class LmCloudSpmd32B(LmCloudSpmd):
    NUM_LAYERS = 40
    MODEL_DIMS = 8192
    HIDDEN_DIMS = 32768
    NUM_HEADS = 64
    PERCORE_BATCH_SIZE = 8
    ICI_MESH_SHAPE = [1, 16, 4]
    CHECKPOINT_POLICY = "SAVE_CONTEXT_AND_OUT_PROJ"


class LmCloudSpmd64B(LmCloudSpmd):
    NUM_LAYERS = 51
    MODEL_DIMS = 10240
    HIDDEN_DIMS = 40960
    NUM_HEADS = 80
    PERCORE_BATCH_SIZE = 4
    ICI_MESH_SHAPE = [1, 16, 8]
    CHECKPOINT_POLICY = "SAVE_CONTEXT_AND_OUT_PROJ"


class LmCloudSpmd128B(LmCloudSpmd):
    NUM_LAYERS = 71
    MODEL_DIMS = 12288
    HIDDEN_DIMS = 49152
    NUM_HEADS = 96
    PERCORE_BATCH_SIZE = 4
    ICI_MESH_SHAPE = [1, 64, 4]


class LmCloudSpmd256B(LmCloudSpmd):
    NUM_LAYERS = 80
    MODEL_DIMS = 16384
    HIDDEN_DIMS = 65536
    NUM_HEADS = 128
    PERCORE_BATCH_SIZE = 4
    ICI_MESH_SHAPE = [1, 64, 8]


class LmCloudSpmd512B(LmCloudSpmd):
    NUM_LAYERS = 102
    MODEL_DIMS = 20480
    HIDDEN_DIMS = 81920
    NUM_HEADS = 160
    PERCORE_BATCH_SIZE = 4
    ICI_MESH_SHAPE = [1, 64, 16]


class LmCloudSpmd1024B(LmCloudSpmd):
    NUM_LAYERS = 142
    MODEL_DIMS = 24576
    HIDDEN_DIMS = 98304
    NUM_HEADS = 192
    PERCORE_BATCH_SIZE = 2
    ICI_MESH_SHAPE = [1, 256, 8]


class LmCloudSpmdMultislice2B(LmCloudSpmd2B):
    """2B with a 2-way data-parallel replica over DCN (two slices)."""

    PERCORE_BATCH_SIZE = 16
    DCN_MESH_SHAPE = [2, 1, 1]


class LmCloudSpmdPipeline(PipelinedExperiment, LmCloudSpmd):
    """Base of the pipelined lm_cloud experiments (Adam, LR 2.5e-4)."""

    ICI_MESH_SHAPE = [1, 1, 1, 1]
    DCN_MESH_SHAPE = [1, 1, 1, 1]


class LmCloudSpmdPipeline9B(LmCloudSpmdPipeline):
    """16 stages of 3 layers, 128 microbatches of 4."""

    NUM_LAYERS = 48
    MODEL_DIMS = 4096
    HIDDEN_DIMS = 16384
    NUM_HEADS = 32
    PERCORE_BATCH_SIZE = 8
    ICI_MESH_SHAPE = [16, 4, 1, 1]
    NUM_STAGES = 16
    MICROBATCH_SIZE = 4
    FPROP_DTYPE = "float32"


class LmCloudSpmdPipeline175B(LmCloudSpmdPipeline):
    """GPT-3 size over 8 hosts x 16 A100s: 8 stages over DCN, sequence 2048."""

    NUM_LAYERS = 96
    MODEL_DIMS = 12288
    HIDDEN_DIMS = 49152
    NUM_HEADS = 96
    MAX_SEQ_LEN = 2048
    PERCORE_BATCH_SIZE = 0.75
    ICI_MESH_SHAPE = [1, 1, 1, 16]
    DCN_MESH_SHAPE = [8, 1, 1, 1]
    NUM_STAGES = 8
    MICROBATCH_SIZE = 2


class LmCloudSpmdPipelineMultislice2B(LmCloudSpmdPipeline):
    """2 stages over DCN; the embedding weight split over (replica, data); streamed inputs."""

    NUM_LAYERS = 18
    MODEL_DIMS = 3072
    HIDDEN_DIMS = 12288
    NUM_HEADS = 24
    PERCORE_BATCH_SIZE = 16
    ICI_MESH_SHAPE = [1, 4, 1, 1]
    DCN_MESH_SHAPE = [2, 1, 1, 1]
    NUM_STAGES = 2
    MICROBATCH_SIZE = 4
    EMB_W_DATA_DIMS = ("replica", "data")
    STREAM_IO = True


class LmCloudSpmdPipelineMultislice2BCircular(LmCloudSpmdPipelineMultislice2B):
    MICROBATCH_SIZE = 8
    CIRCULAR_REPEAT = 3
