"""The base of Pax's LM experiments: model, optimizer and schedule from UPPER_CASE constants.

Constant names and defaults follow Pax (``TransformerLmSpmdAdafactor`` for the model and
``set_default_adam`` for the optimizer), so ``--set NUM_LAYERS=4`` or ``--set LEARNING_RATE=1e-4``
mean what a Pax user expects. Subclasses choose the data by overriding ``datasets()``.
"""

from __future__ import annotations

import math

import fiddle as fdl

from pax_core import (
    Adafactor,
    Adam,
    Constant,
    EarlyStopping,
    Experiment,
    Learner,
    LinearRampupCosineDecay,
    LinearRampupExponentialDecay,
    SyntheticInput,
    Task,
    Train,
    axes,
)
from pax_lm.models import LanguageModel
from pax_transformer.models import TransformerLm


class TransformerLmExperiment(Experiment):
    """A decoder-only LM trained with Adam; Pax's model-mixin defaults.

    Positions are sinusoidal unless ``USE_ROTARY_POSITION_EMB`` or
    ``TRAINABLE_POSITION_EMB`` is set (Pax's default position embedding). The global batch is
    ``PERCORE_BATCH_SIZE`` times the number of devices: the declared mesh's size, or every
    device when no mesh is declared (Pax's pmap path).
    """

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
    CHECKPOINT_POLICY: str | None = "SAVE_NOTHING"
    FPROP_DTYPE = "bfloat16"
    USE_FP8 = False  # the blocks' projections in FP8 (delayed scaling), for Hopper-class GPUs
    FP8_AMAX_HISTORY_LENGTH = 1024

    # Optimizer (Pax's set_default_adam).
    LEARNING_RATE = 2.5e-4
    ADAM_BETA1 = 0.9
    ADAM_BETA2 = 0.99
    ADAM_EPSILON = 1e-6
    ADAM_CLIP_THRESHOLD = 1.0
    WEIGHT_DECAY = 1e-3
    CLIP_GRADIENT_NORM_TO_VALUE = 5.0
    LR_SCHEDULE = "linear_rampup_exponential_decay"
    LR_LRED_WARMUP = 4000
    LR_LRED_DECAY_START = 4001
    LR_LRED_DECAY_END = 300000
    LR_LRED_MIN_RATIO = 0.1
    LR_LRED_MAX = 1.0
    LR_COS_WARMUP = 4000
    LR_COS_DECAY_START = 4001
    LR_COS_DECAY_END = 300000
    LR_COS_MIN_RATIO = 0.1
    LR_COS_MAX = 1.0

    # Training (Pax's SingleTask.Train defaults).
    NUM_TRAIN_STEPS = 10_000_000
    CHECKPOINT_EVERY_N_STEPS = 5000
    CHECKPOINT_MAX_TO_KEEP = 10
    TARGET_LOG_PPLX: float | None = None  # stop once eval log-perplexity is at or below it
    SUMMARY_INTERVAL_STEPS = 100
    EVAL_INTERVAL_STEPS = 100
    PERCORE_BATCH_SIZE: float = 16
    ICI_MESH_SHAPE: list[int] | None = [1, 1, 1]

    def num_devices(self) -> int:
        """Devices of the declared mesh, or all devices when none is declared."""
        if self.ICI_MESH_SHAPE is None:
            import jax

            return jax.device_count()
        return self.mesh_size()

    def global_batch_size(self) -> int:
        batch = self.PERCORE_BATCH_SIZE * self.num_devices()
        if batch != int(batch) or batch < 1:
            raise ValueError(f"PERCORE_BATCH_SIZE {self.PERCORE_BATCH_SIZE} x "
                             f"{self.num_devices()} devices is not a whole batch")
        return int(batch)

    def model_vocab_size(self) -> int:
        """``VOCAB_SIZE``, rounded up when the ``mdl`` mesh axis would not split it evenly (JAX
        shards only evenly): to a multiple of lcm(128, mdl), as MaxText pads its vocabulary.
        Labels never reach the padding rows."""
        if self.ICI_MESH_SHAPE is None or "mdl" not in self.MESH_AXIS_NAMES:
            return self.VOCAB_SIZE
        axis = list(self.MESH_AXIS_NAMES).index("mdl")
        mdl = self.ICI_MESH_SHAPE[axis] * (self.DCN_MESH_SHAPE or [1] * 8)[axis]
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
        return fdl.Config(
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
            remat_policy=self.CHECKPOINT_POLICY,
            dtype=self.FPROP_DTYPE,
            fp8=self.USE_FP8,
            fp8_amax_history=self.FP8_AMAX_HISTORY_LENGTH,
        )

    def lr_schedule(self) -> fdl.Config:
        if self.LR_SCHEDULE == "linear_rampup_exponential_decay":
            return fdl.Config(LinearRampupExponentialDecay, warmup_steps=self.LR_LRED_WARMUP,
                              decay_start=self.LR_LRED_DECAY_START,
                              decay_end=self.LR_LRED_DECAY_END,
                              min_ratio=self.LR_LRED_MIN_RATIO, max=self.LR_LRED_MAX)
        if self.LR_SCHEDULE == "linear_rampup_cosine_decay":
            return fdl.Config(LinearRampupCosineDecay, warmup_steps=self.LR_COS_WARMUP,
                              decay_start=self.LR_COS_DECAY_START, decay_end=self.LR_COS_DECAY_END,
                              min_ratio=self.LR_COS_MIN_RATIO, max=self.LR_COS_MAX)
        if self.LR_SCHEDULE == "constant":
            return fdl.Config(Constant)
        raise ValueError(f"LR_SCHEDULE {self.LR_SCHEDULE!r} is not one of "
                         f"linear_rampup_exponential_decay, linear_rampup_cosine_decay, constant")

    def optimizer(self) -> fdl.Config:
        """Pax's ``set_default_adam``; ``TransformerLmSpmdAdafactor`` has Pax's Adafactor."""
        return fdl.Config(
            Adam,
            learning_rate=self.LEARNING_RATE,
            lr_schedule=self.lr_schedule(),
            beta1=self.ADAM_BETA1,
            beta2=self.ADAM_BETA2,
            epsilon=self.ADAM_EPSILON,
            update_clip_threshold=self.ADAM_CLIP_THRESHOLD,
            weight_decay=self.WEIGHT_DECAY,
            clip_gradient_norm_to_value=self.CLIP_GRADIENT_NORM_TO_VALUE,
        )

    def task(self) -> fdl.Config[Task]:
        return fdl.Config(
            Task,
            model=fdl.Config(LanguageModel, decoder=self.decoder()),
            train=fdl.Config(
                Train,
                learner=fdl.Config(Learner, optimizer=self.optimizer()),
                num_train_steps=self.NUM_TRAIN_STEPS,
                save_interval_steps=self.CHECKPOINT_EVERY_N_STEPS,
                save_max_to_keep=self.CHECKPOINT_MAX_TO_KEEP,
                summary_interval_steps=self.SUMMARY_INTERVAL_STEPS,
                eval_interval_steps=self.EVAL_INTERVAL_STEPS,
                early_stopping=(fdl.Config(EarlyStopping, metric="log_pplx",
                                           target=self.TARGET_LOG_PPLX)
                                if self.TARGET_LOG_PPLX is not None else None),
            ),
        )

    def datasets(self) -> list[fdl.Config]:
        raise NotImplementedError(f"{type(self).__name__} must choose its data")


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


class TransformerLmSpmdAdafactor(TransformerLmExperiment):
    """Pax's model mixin with its own optimizer: ``ShardedAdafactor`` (decay_method adam,
    decay 0.99, beta1 0.9) at 2.5e-4, the learning rate decaying until step 100000.
    Combine it with a dataset mixin, e.g. ``class MyLm(SyntheticDataset,
    TransformerLmSpmdAdafactor)``."""

    ADAFACTOR_DECAY_METHOD = "adam"
    ADAFACTOR_DECAY_ADAM = 0.99
    ADAFACTOR_DECAY_POW = 0.8
    ADAFACTOR_BETA1 = 0.9
    ADAFACTOR_CLIPPING_THRESHOLD = 1.0
    ADAFACTOR_MULTIPLY_BY_PARAMETER_SCALE = False
    LR_LRED_DECAY_END = 100000

    def optimizer(self) -> fdl.Config:
        return fdl.Config(
            Adafactor,
            learning_rate=self.LEARNING_RATE,
            lr_schedule=self.lr_schedule(),
            decay_method=self.ADAFACTOR_DECAY_METHOD,
            decay_adam=self.ADAFACTOR_DECAY_ADAM,
            decay_pow=self.ADAFACTOR_DECAY_POW,
            beta1=self.ADAFACTOR_BETA1,
            clipping_threshold=self.ADAFACTOR_CLIPPING_THRESHOLD,
            multiply_by_parameter_scale=self.ADAFACTOR_MULTIPLY_BY_PARAMETER_SCALE,
            weight_decay=self.WEIGHT_DECAY,
            clip_gradient_norm_to_value=self.CLIP_GRADIENT_NORM_TO_VALUE,
        )
