"""The configured objects an experiment's ``task()`` builds, with Pax's field names and defaults.

Paths follow Pax, so ``--set task.train.num_train_steps=300`` and
``--set task.train.learner.optimizer.learning_rate=1e-4`` mean what a Pax user expects.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from pax_core.config.optimizers import Adam
from pax_core.errors import UsageError

ANOMALY_ACTIONS = ("stop", "skip")
DAMAGED_CHECKPOINT_ACTIONS = ("fallback", "stop")
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclasses.dataclass
class Learner:
    """How gradients become updates.

    ``num_microbatches`` > 1 accumulates gradients over that many slices of each batch before
    one update (the batch must divide evenly).

    ``on_anomaly`` says what a step whose loss or gradient norm is not finite (NaN, Inf) does:
    ``stop`` (the default) ends the run with a message naming the step, before that state is
    evaluated or saved, so the newest checkpoint is the last good one; ``skip`` leaves the
    parameters and optimizer state as they were (Pax's skip-on-anomaly) and counts the step in
    the ``skipped_steps`` metric.

    ``bprop_variable_inclusion`` and ``bprop_variable_exclusion`` (Pax's names) freeze
    parameters: regular expressions matching whole parameter paths
    (``decoder/stack/layer_0/attention/query/kernel``); when inclusions are given only the
    parameters one matches are trained, and none an exclusion matches is. A frozen parameter
    gets no gradient (the backward pass stops at it) and no optimizer state: fine-tuning
    adapters over a frozen model keeps the optimizer's memory to the adapters'.
    """

    optimizer: Any = dataclasses.field(default_factory=Adam)
    num_microbatches: int = 1
    on_anomaly: str = "stop"
    bprop_variable_inclusion: tuple[str, ...] = ()
    bprop_variable_exclusion: tuple[str, ...] = ()

    def __post_init__(self):
        if self.num_microbatches < 1:
            raise ValueError(f"num_microbatches must be >= 1, got {self.num_microbatches}")
        if self.on_anomaly not in ANOMALY_ACTIONS:
            raise ValueError(f"on_anomaly must be one of {', '.join(ANOMALY_ACTIONS)}, got "
                             f"{self.on_anomaly!r}")
        for field in ("bprop_variable_inclusion", "bprop_variable_exclusion"):
            value = getattr(self, field)
            setattr(self, field, (value,) if isinstance(value, str) else tuple(value))
            for pattern in getattr(self, field):
                try:
                    re.compile(pattern)
                except re.error as e:
                    raise ValueError(f"{field}: {pattern!r} is not a regular expression ({e})"
                                     ) from None

    @property
    def freezes(self) -> bool:
        """Whether some parameters may be frozen."""
        return bool(self.bprop_variable_inclusion or self.bprop_variable_exclusion)

    def trained(self, path: str) -> bool:
        """Whether the parameter at ``path`` ('/'-joined) is trained."""
        included = not self.bprop_variable_inclusion or any(
            re.fullmatch(p, path) for p in self.bprop_variable_inclusion)
        return included and not any(re.fullmatch(p, path)
                                    for p in self.bprop_variable_exclusion)

    def transformation(self) -> Any:
        """The optimizer's transformation, confined to the trained parameters when some are
        frozen (the frozen ones' updates are zero and they hold no optimizer state)."""
        tx = self.optimizer.build()
        if not self.freezes:
            return tx
        import optax

        def labels(params: Any) -> Any:
            return trained_mask(self, params, lambda t: "trained" if t else "frozen")

        return optax.multi_transform({"trained": tx, "frozen": optax.set_to_zero()}, labels)


def trained_mask(learner: Learner, params: Any, value: Any = bool) -> Any:
    """The tree of ``value(whether trained)`` over ``params``, by ``learner``'s patterns."""
    import jax

    def leaf(path: Any, _: Any) -> Any:
        return value(learner.trained("/".join(str(getattr(k, "key", k)) for k in path)))

    return jax.tree_util.tree_map_with_path(leaf, params)


@dataclasses.dataclass
class EarlyStopping:
    """Stop training once an eval metric reaches a target (``EARLY_STOP_TARGET``; Pax's
    ``TARGET_LOG_PPLX``).

    After each eval during training, ``metric`` of the eval dataset ``dataset`` (the first one
    when empty) is compared with ``target``: at or below it (at or above it with
    ``higher_is_better``) the run saves that step and ends, exit 0, and the job records it
    (``JOB_DIR/target_reached.json``), so running the same command again trains no further.
    """

    metric: str
    target: float
    dataset: str = ""
    higher_is_better: bool = False

    def __post_init__(self):
        if not math.isfinite(self.target):
            raise ValueError(f"target must be a finite number, got {self.target}")

    def reached(self, value: float) -> bool:
        return value >= self.target if self.higher_is_better else value <= self.target

    def describe(self, value: float) -> str:
        """``eval/test log_pplx 2.68 <= 2.69``."""
        sign = ">=" if self.higher_is_better else "<="
        return f"eval/{self.dataset} {self.metric} {value:.4g} {sign} {self.target:.4g}"


@dataclasses.dataclass
class Train:
    """The schedule of a run (Pax's ``SingleTask.Train`` defaults).

    Besides the newest ``save_max_to_keep`` checkpoints, one every
    ``save_keep_interval_steps`` steps and one every ``save_keep_interval_duration`` (Pax's
    spelling: ``"12h"``, ``"30m"``, ``"2d"``) are kept (0 / None: none).

    ``on_damaged_checkpoint``: a newest checkpoint whose files fail their checksums or do not
    restore is set aside and the one before it restored (``fallback``), or stops the run
    (``stop``). ``early_stopping``: an ``EarlyStopping`` that ends the run at its target.
    ``eval_metric``: the eval metric that stands for the model's quality (the first eval
    dataset's), which the step lines and the end of a run show beside the loss.

    ``eval_use_ema_states``: evaluate (during training and in ``pax eval``), decode and export
    the moving average of the parameters (the optimizer's ``ema_decay``) instead of the
    parameters themselves.

    ``init_from`` (Pax's ``init_from_checkpoint_rules``; ``pax train --init-from``): a job
    directory, a ``pax export`` folder or a weight format's folder whose weights a new job
    starts from, each parameter named by the first of ``init_from_rules`` ((regex, format)
    pairs over parameter paths) that matches it, unless ``init_from_ignore`` does (those keep
    their fresh values); a parameter ``init_from_optional`` matches comes from the source when
    it holds it and keeps its fresh value when not (adapters: continued from a source that
    trained them, fresh on one that did not); with ``init_from_partial`` every parameter left
    unmapped keeps its fresh value (``pax_core.run.warm_start``). A weights-only step
    (``pax import``) lacking some of the model's parameters is read by the same patterns: those
    ``init_from_ignore`` or ``init_from_optional`` match start fresh, and one a rule maps to a
    parameter the step holds takes that parameter's value.
    """

    learner: Learner = dataclasses.field(default_factory=Learner)
    num_train_steps: int = 10_000_000
    save_interval_steps: int = 5000
    save_max_to_keep: int = 10
    save_keep_interval_steps: int = 0
    save_keep_interval_duration: str | None = None
    summary_interval_steps: int = 100
    eval_interval_steps: int = 100
    max_inflight_steps: int = 2
    random_seed: int = 1234
    on_damaged_checkpoint: str = "fallback"
    early_stopping: Any = None
    eval_metric: str = "loss"
    eval_use_ema_states: bool = False
    init_from: str | None = None
    init_from_rules: tuple[tuple[str, str], ...] = (("(.*)", "{}"),)
    init_from_ignore: tuple[str, ...] = ()
    init_from_optional: tuple[str, ...] = ()
    init_from_partial: bool = False

    def __post_init__(self):
        if self.num_train_steps < 0:
            raise ValueError(f"num_train_steps must be >= 0, got {self.num_train_steps}")
        for name in ("save_interval_steps", "save_max_to_keep", "summary_interval_steps",
                     "eval_interval_steps", "max_inflight_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.save_keep_interval_steps < 0:
            raise ValueError(f"save_keep_interval_steps must be >= 0, got "
                             f"{self.save_keep_interval_steps}")
        self.keep_interval_seconds()  # a duration that does not read fails here
        for pattern in [*(p for p, _ in self.init_from_rules), *self.init_from_ignore,
                        *self.init_from_optional]:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(f"init_from_rules, init_from_ignore and init_from_optional "
                                 f"hold regular expressions; {pattern!r} is not one ({e})"
                                 ) from None
        if self.on_damaged_checkpoint not in DAMAGED_CHECKPOINT_ACTIONS:
            raise ValueError(f"on_damaged_checkpoint must be one of "
                             f"{', '.join(DAMAGED_CHECKPOINT_ACTIONS)}, got "
                             f"{self.on_damaged_checkpoint!r}")

    def keep_interval_seconds(self) -> float:
        """``save_keep_interval_duration`` in seconds (0 when unset)."""
        text = self.save_keep_interval_duration
        if not text:
            return 0.0
        number, unit = text[:-1], text[-1:]
        try:
            seconds = float(number) * DURATION_UNITS[unit]
        except (KeyError, ValueError):
            raise ValueError(f"save_keep_interval_duration must be a number and a unit (s, m, "
                             f"h or d), like '12h'; got {text!r}") from None
        if seconds <= 0:
            raise ValueError(f"save_keep_interval_duration must be positive, got {text!r}")
        return seconds

    def init_from_source(self, name: str) -> str | None:
        """The source parameter that parameter ``name`` starts from by the first of
        ``init_from_rules`` matching it, or None (no rule does)."""
        for pattern, template in self.init_from_rules:
            match = re.fullmatch(pattern, name)
            if match:
                try:
                    return template.format(*match.groups())
                except (IndexError, KeyError, ValueError) as e:
                    raise UsageError(f"init_from_rules: ({pattern!r}, {template!r}) does not "
                                     f"fill in for parameter {name} ({type(e).__name__}: {e}); "
                                     f"a format takes one {{}} per group of its expression"
                                     ) from None
        return None

    def init_from_ignores(self, name: str) -> bool:
        """Whether parameter ``name`` keeps its fresh value whatever the source holds."""
        return any(re.fullmatch(p, name) for p in self.init_from_ignore)

    def init_from_may_lack(self, name: str) -> bool:
        """Whether parameter ``name`` keeps its fresh value when the source lacks it."""
        return any(re.fullmatch(p, name) for p in self.init_from_optional)


@dataclasses.dataclass
class Task:
    """A model and how to train it."""

    model: Any
    train: Train = dataclasses.field(default_factory=Train)


@dataclasses.dataclass
class Job:
    """The root of a resolved configuration: what ``pax config`` prints and ``--set`` paths
    start from (``task.…`` and ``datasets[i].…``)."""

    task: Task
    datasets: list[Any]
