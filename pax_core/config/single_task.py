"""The experiment skeleton every modality shares: one model, trained with one optimizer.

Pax's experiments are classes of UPPER_CASE constants, and the constants that say how to train
(the batch, the optimizer, the learning-rate schedule, how often to evaluate and save, when to
stop) mean the same in every modality. They are spelled once, here, with Pax's names, so
``--set OPTIMIZER=lion`` or ``--set LR_COS_WARMUP=500`` means one thing whatever the model is.
A modality's base experiment supplies ``model()`` and its subclasses ``datasets()``; it changes
the defaults by setting constants, never by rebuilding the optimizer or the ``Train`` config.

``OPTIMIZER`` and ``LR_SCHEDULE`` name an entry of ``OPTIMIZERS`` and ``LR_SCHEDULES``: every
optimizer and schedule the core has is there, so each can be chosen in every modality. A
constant left None is derived from others when the config is made (``derive_constants``), so a
value the user sets is kept and a default follows what it depends on (a cosine's decay ends at
``NUM_TRAIN_STEPS`` unless ``LR_COS_DECAY_END`` says otherwise). The defaults are those of the
core's classes (``Adam()``, ``Train()``), read from them, so a constant an experiment does
not set changes nothing.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from typing import Any

import fiddle as fdl

from pax_core.config.experiment import Experiment
from pax_core.config.optimizers import Adafactor, Adam, Lion, Sgd
from pax_core.config.schedules import (
    Constant,
    LinearRampupCosineDecay,
    LinearRampupExponentialDecay,
    LinearRampupPiecewiseConstant,
)
from pax_core.config.task import EarlyStopping, Learner, Task, Train
from pax_core.errors import UsageError

Entry = Callable[["SingleTaskExperiment"], fdl.Config]


def _adam(e: SingleTaskExperiment) -> fdl.Config:
    return fdl.Config(Adam, beta1=e.ADAM_BETA1, beta2=e.ADAM_BETA2, epsilon=e.ADAM_EPSILON,
                      update_clip_threshold=e.ADAM_CLIP_THRESHOLD)


def _adafactor(e: SingleTaskExperiment) -> fdl.Config:
    return fdl.Config(Adafactor, decay_method=e.ADAFACTOR_DECAY_METHOD,
                      decay_adam=e.ADAFACTOR_DECAY_ADAM, decay_pow=e.ADAFACTOR_DECAY_POW,
                      beta1=e.ADAFACTOR_BETA1, clipping_threshold=e.ADAFACTOR_CLIPPING_THRESHOLD,
                      multiply_by_parameter_scale=e.ADAFACTOR_MULTIPLY_BY_PARAMETER_SCALE)


def _lion(e: SingleTaskExperiment) -> fdl.Config:
    return fdl.Config(Lion, beta1=e.LION_BETA1, beta2=e.LION_BETA2,
                      update_clip_threshold=e.LION_CLIP_THRESHOLD)


def _sgd(e: SingleTaskExperiment) -> fdl.Config:
    return fdl.Config(Sgd, momentum=e.MOMENTUM, nesterov=e.NESTEROV)


# Name -> (the optimizer's own settings, the constants (or their prefixes) it reads).
OPTIMIZERS: dict[str, tuple[Entry, tuple[str, ...]]] = {
    "adam": (_adam, ("ADAM_",)),
    "adafactor": (_adafactor, ("ADAFACTOR_",)),
    "lion": (_lion, ("LION_",)),
    "sgd": (_sgd, ("MOMENTUM", "NESTEROV")),
}


def _constant(e: SingleTaskExperiment) -> fdl.Config:
    return fdl.Config(Constant)


def _cosine(e: SingleTaskExperiment) -> fdl.Config:
    return fdl.Config(LinearRampupCosineDecay, warmup_steps=e.LR_COS_WARMUP,
                      decay_start=e.LR_COS_DECAY_START, decay_end=e.LR_COS_DECAY_END,
                      min_ratio=e.LR_COS_MIN_RATIO, max=e.LR_COS_MAX)


def _exponential(e: SingleTaskExperiment) -> fdl.Config:
    return fdl.Config(LinearRampupExponentialDecay, warmup_steps=e.LR_LRED_WARMUP,
                      decay_start=e.LR_LRED_DECAY_START, decay_end=e.LR_LRED_DECAY_END,
                      min_ratio=e.LR_LRED_MIN_RATIO, max=e.LR_LRED_MAX)


def _piecewise(e: SingleTaskExperiment) -> fdl.Config:
    if e.LR_PIECEWISE_BOUNDARIES is None or e.LR_PIECEWISE_VALUES is None:
        raise UsageError(f"LR_SCHEDULE {e.LR_SCHEDULE} needs LR_PIECEWISE_BOUNDARIES (steps) "
                         f"and LR_PIECEWISE_VALUES (multipliers of LEARNING_RATE); set both")
    return fdl.Config(LinearRampupPiecewiseConstant,
                      boundaries=tuple(e.LR_PIECEWISE_BOUNDARIES),
                      values=tuple(e.LR_PIECEWISE_VALUES))


# Pax's schedule names -> (the schedule, the constants (or their prefixes) it reads).
LR_SCHEDULES: dict[str, tuple[Entry, tuple[str, ...]]] = {
    "constant": (_constant, ()),
    "linear_rampup_cosine_decay": (_cosine, ("LR_COS_",)),
    "linear_rampup_exponential_decay": (_exponential, ("LR_LRED_",)),
    "linear_rampup_piecewise_constant": (_piecewise, ("LR_PIECEWISE_",)),
}
# Shorter names for the same schedules (pax-vision's).
LR_SCHEDULE_ALIASES = {"cosine": "linear_rampup_cosine_decay",
                       "exponential": "linear_rampup_exponential_decay",
                       "piecewise": "linear_rampup_piecewise_constant"}


def _default(cls: type, name: str) -> Any:
    """The default of a field of one of the core's dataclasses: a constant that defaults to it
    changes nothing until an experiment sets it."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def _chosen(table: dict[str, tuple[Entry, tuple[str, ...]]], constant: str, name: str,
            aliases: dict[str, str] | None = None) -> tuple[Entry, tuple[str, ...]]:
    """The table's entry for ``name``, or a usage error listing the names there are."""
    name = (aliases or {}).get(name, name)
    if name in table:
        return table[name]
    near = difflib.get_close_matches(name, [*table, *(aliases or {})], n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    raise UsageError(f"{constant} {name!r} is not one of {', '.join(table)}{hint}")


class SingleTaskExperiment(Experiment):
    """One model trained on one training set, evaluated on the others (Pax's ``SingleTask``).

    The global batch is ``PERCORE_BATCH_SIZE`` times the devices (the declared mesh's, or all
    of them without one: Pax's rule) or, for a modality whose recipes fix it, ``BATCH_SIZE``;
    exactly one of the two is set. ``EARLY_STOP_METRIC`` is the eval metric that stands for
    the model's quality (the step lines show it: ``task.train.eval_metric``);
    ``EARLY_STOP_TARGET`` ends training once the first eval set's reaches it. Constants of
    another optimizer or schedule than the chosen ones are read by nothing.
    """

    # The batch.
    PERCORE_BATCH_SIZE: float | None = None
    BATCH_SIZE: int | None = None

    # The optimizer: OPTIMIZERS[OPTIMIZER] with the settings every optimizer has.
    OPTIMIZER: str = "adam"
    LEARNING_RATE: float = _default(Adam, "learning_rate")
    WEIGHT_DECAY: float = _default(Adam, "weight_decay")  # decoupled (LR-scaled in Adafactor)
    L2_REGULARIZER_WEIGHT: float = _default(Adam, "l2_regularizer_weight")
    SKIP_LP_1D_VECTORS: bool = _default(Adam, "skip_lp_1d_vectors")
    CLIP_GRADIENT_NORM_TO_VALUE: float = _default(Adam, "clip_gradient_norm_to_value")
    EMA_DECAY: float = _default(Adam, "ema_decay")  # > 0: keep a moving average of the parameters
    ADAM_BETA1: float = _default(Adam, "beta1")
    ADAM_BETA2: float = _default(Adam, "beta2")
    ADAM_EPSILON: float = _default(Adam, "epsilon")
    ADAM_CLIP_THRESHOLD: float = _default(Adam, "update_clip_threshold")
    ADAFACTOR_DECAY_METHOD: str = _default(Adafactor, "decay_method")
    ADAFACTOR_DECAY_ADAM: float = _default(Adafactor, "decay_adam")
    ADAFACTOR_DECAY_POW: float = _default(Adafactor, "decay_pow")
    ADAFACTOR_BETA1: float = _default(Adafactor, "beta1")
    ADAFACTOR_CLIPPING_THRESHOLD: float = _default(Adafactor, "clipping_threshold")
    ADAFACTOR_MULTIPLY_BY_PARAMETER_SCALE: bool = _default(
        Adafactor, "multiply_by_parameter_scale")
    LION_BETA1: float = _default(Lion, "beta1")  # Lion wants a learning rate 3-10x below Adam's
    LION_BETA2: float = _default(Lion, "beta2")
    LION_CLIP_THRESHOLD: float = _default(Lion, "update_clip_threshold")
    MOMENTUM: float = _default(Sgd, "momentum")  # sgd's
    NESTEROV: bool = _default(Sgd, "nesterov")  # sgd's

    # The schedule: LR_SCHEDULES[LR_SCHEDULE], a multiplier of LEARNING_RATE.
    LR_SCHEDULE: str = "constant"
    LR_COS_WARMUP: int = 0
    LR_COS_DECAY_START: int | None = None  # None: the step after the warm-up
    LR_COS_DECAY_END: int | None = None  # None: NUM_TRAIN_STEPS
    LR_COS_MIN_RATIO: float = _default(LinearRampupCosineDecay, "min_ratio")
    LR_COS_MAX: float = _default(LinearRampupCosineDecay, "max")
    LR_LRED_WARMUP: int = 0
    LR_LRED_DECAY_START: int | None = None  # None: the step after the warm-up
    LR_LRED_DECAY_END: int | None = None  # None: NUM_TRAIN_STEPS
    LR_LRED_MIN_RATIO: float = _default(LinearRampupExponentialDecay, "min_ratio")
    LR_LRED_MAX: float = _default(LinearRampupExponentialDecay, "max")
    LR_PIECEWISE_BOUNDARIES: tuple[int, ...] | None = None
    LR_PIECEWISE_VALUES: tuple[float, ...] | None = None

    # Training (Pax's SingleTask.Train).
    NUM_TRAIN_STEPS: int = _default(Train, "num_train_steps")
    SUMMARY_INTERVAL_STEPS: int = _default(Train, "summary_interval_steps")
    EVAL_INTERVAL_STEPS: int = _default(Train, "eval_interval_steps")
    CHECKPOINT_EVERY_N_STEPS: int = _default(Train, "save_interval_steps")
    CHECKPOINT_MAX_TO_KEEP: int = _default(Train, "save_max_to_keep")
    EVAL_USE_EMA_STATES: bool = _default(Train, "eval_use_ema_states")
    EARLY_STOP_METRIC: str = "loss"
    EARLY_STOP_HIGHER_IS_BETTER: bool = False
    EARLY_STOP_TARGET: float | None = None

    def model(self) -> fdl.Config:
        """The model's config (a modality's base experiment gives it)."""
        raise NotImplementedError(f"{type(self).__name__} must define model()")

    def derive_constants(self) -> None:
        """Fill the constants left None from the others; called once, before the config is
        made. A subclass that derives more calls this one after its own."""
        if self.LR_COS_DECAY_START is None:
            self.LR_COS_DECAY_START = self.LR_COS_WARMUP + 1
        if self.LR_COS_DECAY_END is None:
            self.LR_COS_DECAY_END = self.NUM_TRAIN_STEPS
        if self.LR_LRED_DECAY_START is None:
            self.LR_LRED_DECAY_START = self.LR_LRED_WARMUP + 1
        if self.LR_LRED_DECAY_END is None:
            self.LR_LRED_DECAY_END = self.NUM_TRAIN_STEPS

    def num_devices(self) -> int:
        """Devices of the declared mesh, or all devices when none is declared."""
        if self.ICI_MESH_SHAPE is None:
            import jax

            return jax.device_count()
        return self.mesh_size()

    def global_batch_size(self) -> int:
        per_core, whole = self.PERCORE_BATCH_SIZE, self.BATCH_SIZE
        if (per_core is None) == (whole is None):
            raise UsageError(
                f"experiment {type(self).__name__} must set one of PERCORE_BATCH_SIZE and "
                f"BATCH_SIZE, not {'both' if whole is not None else 'neither'} (PERCORE_"
                f"BATCH_SIZE={per_core}, BATCH_SIZE={whole}); unset the other with --set "
                f"NAME=None")
        if whole is not None:
            return whole
        batch = per_core * self.num_devices()
        if batch != int(batch) or batch < 1:
            raise UsageError(f"PERCORE_BATCH_SIZE {per_core} x {self.num_devices()} devices "
                             f"is not a whole batch")
        return int(batch)

    def lr_schedule(self) -> fdl.Config:
        entry, _ = _chosen(LR_SCHEDULES, "LR_SCHEDULE", self.LR_SCHEDULE, LR_SCHEDULE_ALIASES)
        return entry(self)

    def optimizer(self) -> fdl.Config:
        entry, _ = _chosen(OPTIMIZERS, "OPTIMIZER", self.OPTIMIZER)
        config = entry(self)
        config.learning_rate = self.LEARNING_RATE
        config.lr_schedule = self.lr_schedule()
        config.weight_decay = self.WEIGHT_DECAY
        config.l2_regularizer_weight = self.L2_REGULARIZER_WEIGHT
        config.skip_lp_1d_vectors = self.SKIP_LP_1D_VECTORS
        config.clip_gradient_norm_to_value = self.CLIP_GRADIENT_NORM_TO_VALUE
        config.ema_decay = self.EMA_DECAY
        return config

    def early_stopping(self) -> fdl.Config | None:
        if self.EARLY_STOP_TARGET is None:
            return None
        return fdl.Config(EarlyStopping, metric=self.EARLY_STOP_METRIC,
                          target=self.EARLY_STOP_TARGET,
                          higher_is_better=self.EARLY_STOP_HIGHER_IS_BETTER)

    def train(self) -> fdl.Config[Train]:
        return fdl.Config(
            Train,
            learner=fdl.Config(Learner, optimizer=self.optimizer()),
            num_train_steps=self.NUM_TRAIN_STEPS,
            save_interval_steps=self.CHECKPOINT_EVERY_N_STEPS,
            save_max_to_keep=self.CHECKPOINT_MAX_TO_KEEP,
            summary_interval_steps=self.SUMMARY_INTERVAL_STEPS,
            eval_interval_steps=self.EVAL_INTERVAL_STEPS,
            early_stopping=self.early_stopping(),
            eval_metric=self.EARLY_STOP_METRIC,
            eval_use_ema_states=self.EVAL_USE_EMA_STATES,
        )

    def task(self) -> fdl.Config[Task]:
        self.derive_constants()
        return fdl.Config(Task, model=self.model(), train=self.train())

    @classmethod
    def unread_constants(cls, names: list[str]) -> list[str]:
        """Of ``names``, the constants of an optimizer or schedule this experiment does not
        use: setting them changes nothing."""
        chosen = (*_chosen(OPTIMIZERS, "OPTIMIZER", cls.OPTIMIZER)[1],
                  *_chosen(LR_SCHEDULES, "LR_SCHEDULE", cls.LR_SCHEDULE, LR_SCHEDULE_ALIASES)[1])
        families = [read for _, read in (*OPTIMIZERS.values(), *LR_SCHEDULES.values())]
        every = tuple(p for read in families for p in read)
        return [name for name in names
                if name.startswith(every) and not name.startswith(chosen)]
