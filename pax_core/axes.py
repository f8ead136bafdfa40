"""Axis names: the one place they are spelled.

Layers name the axes of their weights and activations with the *logical* names; the SPMD
partitioner maps them onto the *mesh* axes an experiment declares (``MESH_AXIS_NAMES``) through
``LOGICAL_AXIS_RULES``. Models never name mesh axes, so one model runs under every mapping.
"""

from __future__ import annotations

# Logical axes of weights and activations.
BATCH = "batch"
LENGTH = "length"
EMBED = "embed"
MLP = "mlp"
HEADS = "heads"
KV = "kv"
VOCAB = "vocab"
LAYERS = "layers"
STAGES = "stages"  # a pipeline's stage dimension (its weights, its in-flight activations)
CHANNELS = "channels"  # a convolution's feature maps (its output channels, its activations)
CLASSES = "classes"  # a classifier's outputs
EXPERTS = "experts"  # a Mixture-of-Experts layer's experts (their stacked weights)

LOGICAL = (BATCH, LENGTH, EMBED, MLP, HEADS, KV, VOCAB, LAYERS, STAGES, CHANNELS, CLASSES,
           EXPERTS)

# Mesh axes, Pax's names: data parallelism across slices, FSDP-style data parallelism, model
# (tensor) parallelism; pipelined experiments put a pipeline's stages first, and
# Mixture-of-Experts experiments an expert axis before the model axis.
STAGE = "stage"
REPLICA = "replica"
DATA = "data"
EXPERT = "expert"
MDL = "mdl"

MESH = (REPLICA, DATA, MDL)
PIPELINE_MESH = (STAGE, REPLICA, DATA, MDL)
EXPERT_MESH = (REPLICA, DATA, EXPERT, MDL)

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

# Pax's canonical LM sharding. Weights: a 2-D [data, mdl] layout, replicated over replica.
# Activations: batch over (replica, data), the model dimension over mdl. Rules are tried in
# order and a mesh axis a tensor already uses is skipped, which is how embed lands on data for
# weights but on mdl for activations whose batch took data. Vision models split convolution
# channels and classes over mdl, Megatron-style; with mdl 1 their weights are replicated, as
# in Pax's ResNets.
DEFAULT_RULES: Rules = (
    (BATCH, (REPLICA, DATA)),
    (LENGTH, None),
    (LAYERS, None),
    (VOCAB, MDL),
    (EMBED, DATA),
    (EMBED, MDL),
    (MLP, MDL),
    (HEADS, MDL),
    (KV, None),
    (CHANNELS, MDL),
    (CLASSES, MDL),
    (EXPERTS, None),
)

# Pax's pipelined LM sharding: stacked layer weights split by stage; outside the pipeline
# (embedding, softmax, the loss) the batch is split over every axis but mdl, so all devices
# share that work; inside a stage it keeps (replica, data) (``STAGES`` took ``stage``).
PIPELINE_RULES: Rules = (
    (STAGES, STAGE),
    (LAYERS, STAGE),
    (BATCH, (STAGE, REPLICA, DATA)),
    (BATCH, (REPLICA, DATA)),
    *((name, target) for name, target in DEFAULT_RULES if name not in (BATCH, LAYERS)),
)

# Expert parallelism (``EXPERT_MESH``): each device of the expert axis holds its share of every
# MoE layer's experts, and brings its own share of the batch, which the layer sends to the
# experts' devices and back. Outside the experts the expert axis is more FSDP-style data
# parallelism: the other weights' embed dimension is split over data and expert both (an
# expert's over data, expert being taken), and the rest as by ``DEFAULT_RULES``.
EXPERT_RULES: Rules = (
    (BATCH, (REPLICA, DATA, EXPERT)),
    (EXPERTS, EXPERT),
    (EMBED, (DATA, EXPERT)),
    *((name, target) for name, target in DEFAULT_RULES if name not in (BATCH, EXPERTS)),
)
