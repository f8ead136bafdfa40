"""Pax's lm_cloud family: synthetic data, sequence 1024, vocabulary 32000.

Names, sizes, meshes and schedules are Pax's (``paxml/tasks/lm/params/lm_cloud.py``).
"""

from __future__ import annotations

from pax_lm.experiments.base import PipelinedExperiment, SyntheticDataset, TransformerLmExperiment
from pax_lm.experiments.sizes import size


@size("pmap-1024x32")
class LmCloudTransformerAdam(SyntheticDataset, TransformerLmExperiment):
    """32-layer, 1024-wide model on Pax's data-parallel (pmap) path, Adam at 1e-3."""

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


@size("spmd-base")
class LmCloudSpmd(SyntheticDataset, TransformerLmExperiment):
    """Base of the SPMD family: GELU, repeated (scanned) layers, bf16, Adam at 2.5e-4."""

    ACTIVATION = "gelu"
    USE_REPEATED_LAYER = True
    PERCORE_BATCH_SIZE = 16
    ICI_MESH_SHAPE = [1, 1, 1]
    DCN_MESH_SHAPE = [1, 1, 1]


@size("spmd-test")
class LmCloudSpmdTest(LmCloudSpmd):
    """The CPU test size."""

    PERCORE_BATCH_SIZE = 4


@size("2B")
class LmCloudSpmd2B(LmCloudSpmd):
    """2B on 4 chips (global batch 32; Pax's docstring says 128)."""

    PERCORE_BATCH_SIZE = 8
    ICI_MESH_SHAPE = [1, 4, 1]


class LmCloudSpmd2BLimitSteps(LmCloudSpmd2B):
    """Pax's README "pjit" example."""

    NUM_TRAIN_STEPS = 300


@size("32B")
class LmCloudSpmd32B(LmCloudSpmd):
    PERCORE_BATCH_SIZE = 8
    ICI_MESH_SHAPE = [1, 16, 4]
    CHECKPOINT_POLICY = "SAVE_CONTEXT_AND_OUT_PROJ"


@size("64B")
class LmCloudSpmd64B(LmCloudSpmd):
    PERCORE_BATCH_SIZE = 4
    ICI_MESH_SHAPE = [1, 16, 8]
    CHECKPOINT_POLICY = "SAVE_CONTEXT_AND_OUT_PROJ"


@size("128B")
class LmCloudSpmd128B(LmCloudSpmd):
    PERCORE_BATCH_SIZE = 4
    ICI_MESH_SHAPE = [1, 64, 4]


@size("256B")
class LmCloudSpmd256B(LmCloudSpmd):
    PERCORE_BATCH_SIZE = 4
    ICI_MESH_SHAPE = [1, 64, 8]


@size("512B")
class LmCloudSpmd512B(LmCloudSpmd):
    PERCORE_BATCH_SIZE = 4
    ICI_MESH_SHAPE = [1, 64, 16]


@size("1024B")
class LmCloudSpmd1024B(LmCloudSpmd):
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


@size("9B")
class LmCloudSpmdPipeline9B(LmCloudSpmdPipeline):
    """16 stages of 3 layers, 128 microbatches of 4."""

    PERCORE_BATCH_SIZE = 8
    ICI_MESH_SHAPE = [16, 4, 1, 1]
    NUM_STAGES = 16
    MICROBATCH_SIZE = 4
    FPROP_DTYPE = "float32"


@size("gpt3-175B")
class LmCloudSpmdPipeline175B(LmCloudSpmdPipeline):
    """GPT-3 size over 8 hosts x 16 A100s: 8 stages over DCN, sequence 2048."""

    MAX_SEQ_LEN = 2048
    PERCORE_BATCH_SIZE = 0.75
    ICI_MESH_SHAPE = [1, 1, 1, 16]
    DCN_MESH_SHAPE = [8, 1, 1, 1]
    NUM_STAGES = 8
    MICROBATCH_SIZE = 2


@size("2B")
class LmCloudSpmdPipelineMultislice2B(LmCloudSpmdPipeline):
    """2 stages over DCN; the embedding weight split over (replica, data); streamed inputs."""

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
