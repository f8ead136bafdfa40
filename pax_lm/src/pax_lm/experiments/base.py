"""The base of Pax's LM experiments: the model from UPPER_CASE constants, on the core's skeleton.

Constant names and defaults follow Pax (``TransformerLmSpmdAdafactor`` for the model and
``set_default_adam`` for the optimizer), so ``--set NUM_LAYERS=4`` or ``--set LEARNING_RATE=1e-4``
mean what a Pax user expects; the optimizer, schedule and training constants are the core's
(``pax_core.SingleTaskExperiment``). Subclasses choose the data by overriding ``datasets()``.
"""

from __future__ import annotations

import math

import fiddle as fdl

from pax_core import SingleTaskExperiment, SyntheticInput, Train, UsageError, axes
from pax_lm.models import LanguageModel
from pax_lm.quantized_training import check as check_quantized_training
from pax_transformer import ADAPTER_WEIGHTS, MoeFeedForward, TransformerLm

# The remat policies ``CHECKPOINT_POLICY="auto"`` chooses from, the most memory (the least
# recomputation) first: none, every matrix product's output, the attention's projections and
# context, its context and output (with the attention kernel's residuals: its forward pass runs
# once), its projections, nothing. On one v5e chip the 470M benchmark holds 12.3 GiB and trains
# at 30,470 tokens/s saving the context and output; saving the projections too fits only by the
# compiler's own recomputation, which ``auto`` passes over (bench/results/tpu_train.md).
REMAT_BY_MEMORY: tuple[str | None, ...] = (
    None, "SAVE_DOT_ONLY", "SAVE_DOT_FOR_MLPERF_200B", "SAVE_CONTEXT_AND_OUT_PROJ",
    "SAVE_QKV_OUT_PROJ", "SAVE_NOTHING")


class TransformerLmExperiment(SingleTaskExperiment):
    """A decoder-only LM trained with Adam; Pax's model-mixin defaults.

    Positions are sinusoidal unless ``USE_ROTARY_POSITION_EMB`` or
    ``TRAINABLE_POSITION_EMB`` is set (Pax's default position embedding). The global batch is
    ``PERCORE_BATCH_SIZE`` times the number of devices: the declared mesh's size, or every
    device when no mesh is declared (Pax's pmap path). Early stopping watches the eval
    log-perplexity (``EARLY_STOP_TARGET``, or Pax's ``TARGET_LOG_PPLX``).
    """

    constant_aliases = {"TARGET_LOG_PPLX": "EARLY_STOP_TARGET"}

    # Model.
    NUM_LAYERS = 10
    MODEL_DIMS = 2048
    HIDDEN_DIMS: int | None = None
    NUM_HEADS: int | None = None
    DIMS_PER_HEAD = 128
    NUM_KV_HEADS: int | None = None
    VOCAB_SIZE = 32000
    MAX_SEQ_LEN = 1024
    ACTIVATION = "relu"
    USE_GATED_ACTIVATION = False
    NORMALIZATION = "layernorm"
    NORM_EPSILON = 1e-6
    USE_ROTARY_POSITION_EMB = False
    TRAINABLE_POSITION_EMB = False
    TRAINABLE_PE_MAX_SEQ_LEN = 16384
    ATTEN_LOGIT_CAP = 50.0
    SOFTMAX_CAP = 30.0
    USE_BIAS = False
    SEPARATE_EMBEDDING = False
    SCALE_EMBEDDING = True
    INIT_STD: float | None = None
    DROPOUT_PROB = 0.0
    USE_REPEATED_LAYER = False
    # A remat policy by Pax's name, None for none, or "auto": on devices with a memory limit
    # the least recomputation whose compiled step fits (REMAT_BY_MEMORY, pax_core's fitting),
    # elsewhere (the host CPU) Pax's default, SAVE_NOTHING.
    CHECKPOINT_POLICY: str | None = "auto"
    FPROP_DTYPE = "bfloat16"
    USE_FP8 = False  # the blocks' projections in FP8 (delayed scaling), for Hopper-class GPUs
    FP8_AMAX_HISTORY_LENGTH = 1024
    # "int8": the blocks' attention and feed-forward projections as int8 x int8 matmuls, forward
    # and backward (Qwix's quantized training, as AQT did for Pax; pax_lm.quantized_training);
    # the weights, the optimizer and checkpoints stay float32. None: in FPROP_DTYPE.
    QUANTIZE_TRAINING: str | None = None
    # The open decoder families' settings (pax-transformer's fields of the same meaning).
    ROTARY_BASE = 10000.0
    ROTARY_FRACTION = 1.0
    ROTARY_SCALING = "none"
    ROTARY_SCALING_FACTOR = 1.0
    ROTARY_LOW_FREQ_FACTOR = 1.0
    ROTARY_HIGH_FREQ_FACTOR = 4.0
    ROTARY_ORIGINAL_MAX_LEN = 8192
    LOCAL_ROTARY_BASE: float | None = None
    SLIDING_WINDOW = 0
    GLOBAL_EVERY = 0
    QKV_BIAS = False
    HEAD_BIAS: bool | None = None  # the untied output projection's bias (None: as USE_BIAS)
    QK_NORM = False
    NORM_SCALE_OFFSET = 0.0
    POST_NORMS = False
    PARALLEL_RESIDUAL = False
    SHARED_NORM = False
    QUERY_SCALE: float | None = None
    # Compute exactly as praxis does (``pax import paxml`` sets it): per-dimension query
    # scaling, feed-forward biases, a bias on the logits, LayerNorms scaling by 1 + scale, GELU
    # in its tanh form, and the sinusoid kept beside rotary.
    PRAXIS_CONVENTIONS = False
    # Fine-tuning with low-rank adapters: LORA_RANK > 0 adds them on LORA_TARGETS (query, key,
    # value, output, gate, up, down, or path patterns) and trains them alone, the base frozen.
    LORA_RANK = 0
    LORA_ALPHA = 16.0
    LORA_TARGETS: tuple[str, ...] = ("query", "value")
    LORA_DROPOUT = 0.0
    # Mixture-of-Experts (pax-transformer's MoeFeedForward), with NUM_EXPERTS > 0: each token
    # goes to NUM_EXPERTS_PER_TOKEN of NUM_EXPERTS feed-forwards of MOE_HIDDEN_DIMS units
    # (None: HIDDEN_DIMS), in every MOE_EVERY-th layer past the first FIRST_DENSE_LAYERS (the
    # others dense); EXPERT_CAPACITY_FACTOR None computes every choice (dropless), a number
    # gives each expert that many times its even share of a sequence's tokens and drops the
    # rest (GShard). NUM_SHARED_EXPERTS feed-forwards of MOE_HIDDEN_DIMS every token goes
    # through (DeepSeek). The experts compute as the dense layers (ACTIVATION,
    # USE_GATED_ACTIVATION) unless MOE_ACTIVATION / MOE_GATED say otherwise (GLaM: gated GELU
    # dense layers, plain ReLU experts). The auxiliary losses' weights:
    # MOE_LOAD_BALANCING_WEIGHT (Switch, GShard) and MOE_Z_LOSS_WEIGHT (ST-MoE's router z-loss).
    NUM_EXPERTS = 0
    NUM_EXPERTS_PER_TOKEN = 2
    MOE_HIDDEN_DIMS: int | None = None
    EXPERT_CAPACITY_FACTOR: float | None = None
    NUM_SHARED_EXPERTS = 0
    NORMALIZE_EXPERT_WEIGHTS = True
    MOE_EVERY = 1
    FIRST_DENSE_LAYERS = 0
    MOE_ACTIVATION: str | None = None
    MOE_GATED: bool | None = None
    MOE_LOAD_BALANCING_WEIGHT = 0.01
    MOE_Z_LOSS_WEIGHT = 0.0

    # Optimizer (Pax's set_default_adam).
    LEARNING_RATE = 2.5e-4
    ADAM_BETA2 = 0.99
    ADAM_CLIP_THRESHOLD = 1.0
    WEIGHT_DECAY = 1e-3
    CLIP_GRADIENT_NORM_TO_VALUE = 5.0
    LR_SCHEDULE = "linear_rampup_exponential_decay"
    LR_LRED_WARMUP = 4000
    LR_LRED_DECAY_START = 4001
    LR_LRED_DECAY_END = 300000
    LR_LRED_MIN_RATIO = 0.1
    LR_COS_WARMUP = 4000
    LR_COS_DECAY_START = 4001
    LR_COS_DECAY_END = 300000
    LR_COS_MIN_RATIO = 0.1

    # Training (Pax's SingleTask.Train defaults).
    EARLY_STOP_METRIC = "log_pplx"
    PERCORE_BATCH_SIZE = 16
    ICI_MESH_SHAPE: list[int] | None = [1, 1, 1]

    def auto_choices(self) -> dict[str, tuple[str | None, ...]]:
        """What ``auto`` constants may become, most memory first (pax_core's fitting)."""
        return {"CHECKPOINT_POLICY": REMAT_BY_MEMORY}

    def _mesh_axis_size(self, name: str) -> int:
        """How many devices the declared mesh's axis ``name`` spans (1 without one)."""
        if self.ICI_MESH_SHAPE is None or name not in self.MESH_AXIS_NAMES:
            return 1
        axis = list(self.MESH_AXIS_NAMES).index(name)
        return self.ICI_MESH_SHAPE[axis] * (self.DCN_MESH_SHAPE or [1] * 8)[axis]

    def model_vocab_size(self) -> int:
        """``VOCAB_SIZE``, rounded up when the ``mdl`` mesh axis would not split it evenly (JAX
        shards only evenly): to a multiple of lcm(128, mdl), as MaxText pads its vocabulary.
        Labels never reach the padding rows."""
        mdl = self._mesh_axis_size(axes.MDL)
        if self.VOCAB_SIZE % mdl == 0:
            return self.VOCAB_SIZE
        multiple = math.lcm(128, mdl)
        return -(-self.VOCAB_SIZE // multiple) * multiple

    def position(self) -> str:
        if self.TRAINABLE_POSITION_EMB:
            return "learned"
        return "rotary" if self.USE_ROTARY_POSITION_EMB else "sinusoidal"

    def decoder(self) -> fdl.Config[TransformerLm]:
        learned = self.TRAINABLE_POSITION_EMB
        decoder = fdl.Config(
            TransformerLm,
            vocab_size=self.model_vocab_size(),
            num_layers=self.NUM_LAYERS,
            model_dims=self.MODEL_DIMS,
            hidden_dims=self.HIDDEN_DIMS or 4 * self.MODEL_DIMS,
            num_heads=self.NUM_HEADS or self.MODEL_DIMS // self.DIMS_PER_HEAD,
            dim_per_head=self.DIMS_PER_HEAD,
            num_kv_heads=self.NUM_KV_HEADS,
            activation=self.ACTIVATION,
            gated=self.USE_GATED_ACTIVATION,
            norm=self.NORMALIZATION,
            norm_epsilon=self.NORM_EPSILON,
            position=self.position(),
            max_seq_len=self.TRAINABLE_PE_MAX_SEQ_LEN if learned else self.MAX_SEQ_LEN,
            tied_embedding=not self.SEPARATE_EMBEDDING,
            scale_embedding=self.SCALE_EMBEDDING,
            attention_logit_cap=self.ATTEN_LOGIT_CAP,
            logits_soft_cap=self.SOFTMAX_CAP,
            use_bias=self.USE_BIAS,
            dropout_rate=self.DROPOUT_PROB,
            init_std=self.INIT_STD,
            scan_layers=self.USE_REPEATED_LAYER,
            remat_policy=("SAVE_NOTHING" if self.CHECKPOINT_POLICY == "auto"
                          else self.CHECKPOINT_POLICY),
            dtype=self.FPROP_DTYPE,
            fp8=self.USE_FP8,
            fp8_amax_history=self.FP8_AMAX_HISTORY_LENGTH,
            rotary_base=self.ROTARY_BASE,
            rotary_fraction=self.ROTARY_FRACTION,
            rotary_scaling=self.ROTARY_SCALING,
            rotary_scaling_factor=self.ROTARY_SCALING_FACTOR,
            rotary_low_freq_factor=self.ROTARY_LOW_FREQ_FACTOR,
            rotary_high_freq_factor=self.ROTARY_HIGH_FREQ_FACTOR,
            rotary_original_max_len=self.ROTARY_ORIGINAL_MAX_LEN,
            local_rotary_base=self.LOCAL_ROTARY_BASE,
            sliding_window=self.SLIDING_WINDOW,
            global_every=self.GLOBAL_EVERY,
            qkv_bias=self.QKV_BIAS,
            head_bias=self.HEAD_BIAS,
            qk_norm=self.QK_NORM,
            norm_scale_offset=self.NORM_SCALE_OFFSET,
            post_norms=self.POST_NORMS,
            parallel_residual=self.PARALLEL_RESIDUAL,
            shared_norm=self.SHARED_NORM,
            query_scale=self.QUERY_SCALE,
            lora_rank=self.LORA_RANK,
            lora_alpha=self.LORA_ALPHA,
            lora_targets=tuple(self.LORA_TARGETS),
            lora_dropout=self.LORA_DROPOUT,
        )
        if self.PRAXIS_CONVENTIONS:
            _praxis_conventions(decoder)
        if self.NUM_EXPERTS:
            self._sparse(decoder)
        return decoder

    def _sparse(self, decoder: fdl.Config[TransformerLm]) -> None:
        """The Mixture-of-Experts settings above, on ``decoder``."""
        split = self._mesh_axis_size(axes.EXPERT)
        if self.NUM_EXPERTS % split:
            raise UsageError(f"NUM_EXPERTS={self.NUM_EXPERTS} does not divide over the "
                             f"{split} devices of the mesh's expert axis (ICI_MESH_SHAPE "
                             f"{self.ICI_MESH_SHAPE}); use a multiple of {split} experts or "
                             f"another mesh")
        experts = fdl.Partial(
            MoeFeedForward, num_experts=self.NUM_EXPERTS, top_k=self.NUM_EXPERTS_PER_TOKEN,
            capacity_factor=self.EXPERT_CAPACITY_FACTOR, shared_experts=self.NUM_SHARED_EXPERTS,
            normalize_top_k=self.NORMALIZE_EXPERT_WEIGHTS,
            load_balancing_weight=self.MOE_LOAD_BALANCING_WEIGHT,
            z_loss_weight=self.MOE_Z_LOSS_WEIGHT)
        for field, value in (("hidden_dims", self.MOE_HIDDEN_DIMS),
                             ("activation", self.MOE_ACTIVATION), ("gated", self.MOE_GATED)):
            if value is not None:  # else the block's own
                setattr(experts, field, value)
        decoder.feed_forward = experts
        decoder.moe_every = self.MOE_EVERY
        decoder.first_dense_layers = self.FIRST_DENSE_LAYERS

    def model(self) -> fdl.Config[LanguageModel]:
        return self.quantized_training(fdl.Config(LanguageModel, decoder=self.decoder()))

    def quantized_training(self, model: fdl.Config[LanguageModel]) -> fdl.Config[LanguageModel]:
        """``model`` (a ``LanguageModel``'s config, or a subclass's) trained as
        ``QUANTIZE_TRAINING`` says, checked here so that a bad value or combination is refused
        before anything is built; unchanged for None."""
        check_quantized_training(self.QUANTIZE_TRAINING, model.decoder)
        if self.QUANTIZE_TRAINING is not None:
            model.quantize_training = self.QUANTIZE_TRAINING
        return model

    def train(self) -> fdl.Config[Train]:
        """The core's, training only the adapters when there are any."""
        train = super().train()
        if self.LORA_RANK:  # the adapters train: a source's when it has them, else fresh
            train.learner.bprop_variable_inclusion = (ADAPTER_WEIGHTS,)
            train.init_from_optional = (*train.init_from_optional, ADAPTER_WEIGHTS)
        return train

    def datasets(self) -> list[fdl.Config]:
        raise NotImplementedError(f"{type(self).__name__} must choose its data")


def _praxis_conventions(decoder: fdl.Config[TransformerLm]) -> None:
    """What praxis's layers compute by default that pax-transformer's do not (praxis 1.4):
    ``PerDimScale`` on the queries, biases on the feed-forward (none in attention) and on the
    softmax, tied or not, LayerNorm's stored scale as the delta from 1 (its RmsNorm scales
    directly), ``layers.GELU`` as the tanh approximation, and the position embedding left in
    place when Pax's ``USE_ROTARY_POSITION_EMB`` turns on rotary attention."""
    decoder.per_dim_scale = True
    decoder.ffn_bias = True
    decoder.head_bias = True
    if decoder.norm == "layernorm":
        decoder.norm_scale_offset = 1.0
    if decoder.activation == "gelu":
        decoder.activation = "gelu_tanh"
    if decoder.position == "rotary":
        decoder.position = "sinusoidal_rotary"


class SyntheticDataset:
    """Mixin: random tokens as Pax's lm_cloud ``SyntheticDataset`` (train and eval)."""

    def datasets(self) -> list[fdl.Config[SyntheticInput]]:
        common = dict(kind="tokens", batch_size=self.global_batch_size(),
                      seq_len=self.MAX_SEQ_LEN, vocab_size=self.VOCAB_SIZE)
        return [
            fdl.Config(SyntheticInput, name="train", is_training=True, seed=1234, **common),
            fdl.Config(SyntheticInput, name="test", is_training=False, seed=4321, **common),
        ]


class PipelinedExperiment:
    """Mixin for Pax's pipelined experiments (pax-pipeline): the decoder's layers run as a
    pipeline over the ``stage`` mesh axis, Pax's constants choosing the schedule.

    ``NUM_STAGES`` stages (the size of the mesh's ``stage`` axis), microbatches by
    ``MICROBATCH_SIZE`` or ``NUM_MICROBATCHES`` (exactly one), ``CIRCULAR_REPEAT`` > 1 for the
    circular schedule, ``STREAM_IO`` to keep the microbatches sharded over the stages.
    """

    REQUIRED_PLUGINS = ("pax-pipeline",)
    PARTITIONER = "pipeline"
    MESH_AXIS_NAMES = axes.PIPELINE_MESH
    NUM_STAGES = 1
    MICROBATCH_SIZE: int | None = None
    NUM_MICROBATCHES: int | None = None
    CIRCULAR_REPEAT = 1
    STREAM_IO = False

    def decoder(self) -> fdl.Config[TransformerLm]:
        # Imported here: pax-pipeline is optional for pax-lm, and REQUIRED_PLUGINS has been
        # checked before an experiment builds its config.
        from pax_pipeline import Pipeline, experiment_settings

        config = super().decoder()
        config.stack = fdl.Config(Pipeline, **experiment_settings(self))
        return config


class ExpertParallel:
    """Mixin: a mesh with an ``expert`` axis (``pax_core.axes.EXPERT_MESH``: replica, data,
    expert, mdl) over which each MoE layer's experts are split, the batch split over it too
    (``EXPERT_RULES``); NUM_EXPERTS must divide over it."""

    MESH_AXIS_NAMES = axes.EXPERT_MESH
    LOGICAL_AXIS_RULES = axes.EXPERT_RULES


class TransformerLmSpmdAdafactor(TransformerLmExperiment):
    """Pax's model mixin with its own optimizer: ``ShardedAdafactor`` (decay_method adam,
    decay 0.99, beta1 0.9) at 2.5e-4, the learning rate decaying until step 100000.
    Combine it with a dataset mixin, e.g. ``class MyLm(SyntheticDataset,
    TransformerLmSpmdAdafactor)``."""

    OPTIMIZER = "adafactor"
    ADAFACTOR_BETA1 = 0.9
    LR_LRED_DECAY_END = 100000
