"""Optimizers as Pax configures them: a learning rate times a schedule, clipping, weight decay.

Each is a dataclass (so Fiddle can configure it and ``--set`` can reach every field, e.g.
``task.train.learner.optimizer.learning_rate=3e-4``) that builds an Optax transformation. The
learning rate at a step is ``learning_rate * lr_schedule(step)``, Pax's convention.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import optax

from pax_core.config.schedules import Constant


@dataclasses.dataclass
class Optimizer:
    """Settings every optimizer shares.

    ``clip_gradient_norm_to_value`` clips the global gradient norm (0: off).
    ``weight_decay`` is decoupled: added to the update before the learning-rate scaling.
    """

    learning_rate: float = 1e-3
    lr_schedule: Any = dataclasses.field(default_factory=Constant)
    clip_gradient_norm_to_value: float = 0.0
    weight_decay: float = 0.0

    def __post_init__(self):
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise ValueError(f"learning_rate must be a finite number > 0, got "
                             f"{self.learning_rate}")

    def learning_rate_at(self, step: Any) -> Any:
        return self.learning_rate * self.lr_schedule(step)

    def update_rule(self) -> optax.GradientTransformation:
        """The optimizer's own scaling of gradients, before decay and learning rate."""
        raise NotImplementedError

    def build(self) -> optax.GradientTransformation:
        parts = []
        if self.clip_gradient_norm_to_value > 0:
            parts.append(optax.clip_by_global_norm(self.clip_gradient_norm_to_value))
        parts.append(self.update_rule())
        if self.weight_decay > 0:
            parts.append(optax.add_decayed_weights(self.weight_decay))
        parts.append(optax.scale_by_learning_rate(self.learning_rate_at))
        return optax.chain(*parts)


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
class Sgd(Optimizer):
    """Stochastic gradient descent, with optional (Nesterov) momentum."""

    momentum: float = 0.0
    nesterov: bool = False

    def update_rule(self) -> optax.GradientTransformation:
        if self.momentum == 0:
            return optax.identity()
        return optax.trace(decay=self.momentum, nesterov=self.nesterov)
