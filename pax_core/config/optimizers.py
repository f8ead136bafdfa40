"""Optimizers as Pax configures them: a learning rate times a schedule, clipping, weight decay,
and optionally a moving average of the parameters.

Each is a dataclass (so Fiddle can configure it and ``--set`` can reach every field, e.g.
``task.train.learner.optimizer.learning_rate=3e-4``) that builds an Optax transformation. The
learning rate at a step is ``learning_rate * lr_schedule(step)``, Pax's convention.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import optax

from pax_core.config.schedules import Constant
from pax_core.config.transforms import DECAY_METHODS, pax_adafactor, track_ema


@dataclasses.dataclass
class Optimizer:
    """Settings every optimizer shares.

    ``clip_gradient_norm_to_value`` clips the global gradient norm (0: off).
    ``weight_decay`` is decoupled: added to the update before the learning-rate scaling.
    ``l2_regularizer_weight`` is coupled L2 regularisation (Pax's): ``weight x parameter`` added
    to the clipped gradient, so it passes through momentum like the loss's own gradient.
    ``skip_lp_1d_vectors`` exempts parameters of at most one dimension (biases, norm scales)
    from both, as Pax's ResNets do.
    ``ema_decay`` in (0, 1) keeps an exponential moving average of the parameters in the
    optimizer state (saved with it; evaluated with ``task.train.eval_use_ema_states``).
    """

    learning_rate: float = 1e-3
    lr_schedule: Any = dataclasses.field(default_factory=Constant)
    clip_gradient_norm_to_value: float = 0.0
    weight_decay: float = 0.0
    l2_regularizer_weight: float = 0.0
    skip_lp_1d_vectors: bool = False
    ema_decay: float = 0.0

    def __post_init__(self):
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"learning_rate must be a finite number > 0, got "
                             f"{self.learning_rate}")
        for name in ("weight_decay", "l2_regularizer_weight"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0 (0: off), got {getattr(self, name)}")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay must be in [0, 1) (0: no average), got "
                             f"{self.ema_decay}")

    def learning_rate_at(self, step: Any) -> Any:
        return self.learning_rate * self.lr_schedule(step)

    def update_rule(self) -> optax.GradientTransformation:
        """The optimizer's own scaling of gradients, before decay and learning rate."""
        raise NotImplementedError

    def scaled_update(self) -> list[optax.GradientTransformation]:
        """The update rule, then decay, then the learning rate: the final updates."""
        parts = [self.update_rule()]
        if self.weight_decay > 0:
            parts.append(self.decayed_weights(self.weight_decay))
        return [*parts, optax.scale_by_learning_rate(self.learning_rate_at)]

    def decayed_weights(self, weight: float) -> optax.GradientTransformation:
        """``weight x parameter`` added to the updates, 1-D parameters left out with
        ``skip_lp_1d_vectors``."""
        mask = _matrices if self.skip_lp_1d_vectors else None
        return optax.add_decayed_weights(weight, mask=mask)

    def build(self) -> optax.GradientTransformation:
        parts = []
        if self.clip_gradient_norm_to_value > 0:
            parts.append(optax.clip_by_global_norm(self.clip_gradient_norm_to_value))
        if self.l2_regularizer_weight > 0:
            parts.append(self.decayed_weights(self.l2_regularizer_weight))
        parts.extend(self.scaled_update())
        if self.ema_decay > 0:
            parts.append(track_ema(self.ema_decay))
        return optax.chain(*parts)


def _matrices(params: Any) -> Any:
    return jax.tree.map(lambda p: p.ndim > 1, params)


@dataclasses.dataclass
class Adam(Optimizer):
    """Adam with Pax's defaults (ε 1e-6) and optional update clipping.

    ``update_clip_threshold`` > 0 rescales each variable's update to at most that RMS, as Pax's
    Adam does with ``clip_threshold``.
    """

    beta1: float = 0.9
    beta2: float = 0.999
    epsilon: float = 1e-6
    update_clip_threshold: float = 0.0

    def update_rule(self) -> optax.GradientTransformation:
        rule = optax.scale_by_adam(b1=self.beta1, b2=self.beta2, eps=self.epsilon)
        if self.update_clip_threshold > 0:
            return optax.chain(rule, optax.clip_by_block_rms(self.update_clip_threshold))
        return rule


@dataclasses.dataclass
class Lion(Optimizer):
    """Lion (Chen et al. 2023): the sign of a mix of gradient and momentum, so every update
    has the same size and the learning rate is typically 3-10x smaller than Adam's. Pax's
    ``update_capping`` is ``update_clip_threshold``."""

    beta1: float = 0.9
    beta2: float = 0.99
    update_clip_threshold: float = 0.0

    def update_rule(self) -> optax.GradientTransformation:
        rule = optax.scale_by_lion(b1=self.beta1, b2=self.beta2)
        if self.update_clip_threshold > 0:
            return optax.chain(rule, optax.clip_by_block_rms(self.update_clip_threshold))
        return rule


@dataclasses.dataclass
class Adafactor(Optimizer):
    """Adafactor with Pax's ``ShardedAdafactor`` settings and arithmetic.

    Parameters of two or more dimensions keep factored second moments over their last two
    dimensions (a row and a column vector instead of a full matrix; ``factored=False``: full).
    ``decay_method`` ``adam`` decays them at ``decay_adam`` with Adam's bias correction, ``pow``
    at ``1 - (step + 1) ** -decay_pow``. Each variable's update is clipped to RMS
    ``clipping_threshold`` (0: off), scaled by the learning rate (times the parameter's RMS,
    at least ``epsilon2``, with ``multiply_by_parameter_scale``), then averaged with momentum
    ``beta1`` (0: none, Pax's default). ``weight_decay`` is decoupled and scaled by the learning
    rate. Pax's int8 momentum is kept in float32 here.
    """

    decay_method: str = "adam"
    decay_adam: float = 0.99
    decay_pow: float = 0.8
    beta1: float = 0.0
    clipping_threshold: float = 1.0
    factored: bool = True
    epsilon1: float = 1e-30
    multiply_by_parameter_scale: bool = False
    epsilon2: float = 1e-3

    def __post_init__(self):
        super().__post_init__()
        if self.decay_method not in DECAY_METHODS:
            raise ValueError(f"decay_method must be one of {', '.join(DECAY_METHODS)}, got "
                             f"{self.decay_method!r}")
        rate = self.decay_adam if self.decay_method == "adam" else self.decay_pow
        if not 0 < rate < 1:
            raise ValueError(f"decay_{self.decay_method} must be in (0, 1), got {rate}")
        if not 0 <= self.beta1 < 1:
            raise ValueError(f"beta1 must be in [0, 1), got {self.beta1}")

    def scaled_update(self) -> list[optax.GradientTransformation]:
        return [pax_adafactor(
            self.learning_rate_at, decay_method=self.decay_method,
            decay_rate=self.decay_adam if self.decay_method == "adam" else self.decay_pow,
            beta1=self.beta1, clipping_threshold=self.clipping_threshold,
            factored=self.factored, epsilon1=self.epsilon1,
            multiply_by_parameter_scale=self.multiply_by_parameter_scale,
            epsilon2=self.epsilon2, weight_decay=self.weight_decay,
            decay_1d=not self.skip_lp_1d_vectors)]


@dataclasses.dataclass
class Sgd(Optimizer):
    """Stochastic gradient descent, with optional (Nesterov) momentum."""

    momentum: float = 0.0
    nesterov: bool = False

    def update_rule(self) -> optax.GradientTransformation:
        if self.momentum == 0:
            return optax.identity()
        return optax.trace(decay=self.momentum, nesterov=self.nesterov)
