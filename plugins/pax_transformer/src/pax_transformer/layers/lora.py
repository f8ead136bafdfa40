"""Low-rank adapters (LoRA, Hu et al. 2021) on a block's projections.

An adapted projection computes ``x W + (alpha / rank) * dropout(x) A B``: ``A`` [inputs...,
rank] starts uniform in +-1/sqrt(fan_in) and ``B`` [rank, outputs...] at zero, so a fresh
adapter changes nothing. Fine-tuning trains only the adapters (``ADAPTER_WEIGHTS`` names them
for the learner's ``bprop_variable_inclusion``) and keeps the base weights frozen, so the
optimizer holds state for the adapters alone; ``merge_adapter`` folds an adapter into its
kernel for serving or export.

Targets name projections by their path in a block (``attention/query``, ``ffn/wi_gate``), by
a short name (query, key, value, output, gate, up, down: Hugging Face's q/k/v/o and
gate/up/down projections), or by a regular expression matching whole paths.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable

import numpy as np

# The short names of a block's projections.
ALIASES = {"query": "attention/query", "key": "attention/key", "value": "attention/value",
           "output": "attention/out", "gate": "ffn/wi_gate", "up": "ffn/wi", "down": "ffn/wo"}
# Parameter paths of the adapters' weights, for the learner's bprop_variable_inclusion.
ADAPTER_WEIGHTS = r".*/lora_[ab]"


@dataclasses.dataclass(frozen=True)
class Lora:
    """Which projections carry adapters (``targets``), their ``rank``, ``alpha`` (the update
    is scaled by alpha / rank) and the ``dropout`` on their inputs while training."""

    rank: int
    alpha: float = 16.0
    targets: tuple[str, ...] = ("query", "value")
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"lora rank must be a positive integer, got {self.rank}")
        if not self.alpha > 0:
            raise ValueError(f"lora alpha must be positive, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora dropout must be in [0, 1), got {self.dropout}")
        if not self.targets:
            raise ValueError("lora targets are empty; name the projections to adapt (query, "
                             "key, value, output, gate, up, down, or a path pattern)")
        for target in self.targets:
            try:
                re.compile(ALIASES.get(target, target))
            except re.error as e:
                raise ValueError(f"lora target {target!r} is not a projection name or a "
                                 f"regular expression ({e})") from None

    @property
    def scale(self) -> float:
        """The factor on the adapters' product."""
        return self.alpha / self.rank

    def adapts(self, projection: str) -> bool:
        """Whether the projection at ``projection`` (its path in a block) carries an adapter."""
        return any(re.fullmatch(ALIASES.get(t, t), projection) for t in self.targets)

    def check(self, projections: Iterable[str]) -> None:
        """Refuse a target that adapts none of ``projections`` (a block's, by path)."""
        projections = list(projections)
        for target in self.targets:
            if not any(re.fullmatch(ALIASES.get(target, target), p) for p in projections):
                raise ValueError(f"lora target {target!r} matches no projection of this model "
                                 f"(its projections: {', '.join(projections)})")


def merge_adapter(kernel: np.ndarray, a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
    """``kernel`` [inputs..., outputs...] with the adapter ``a`` [inputs..., rank], ``b``
    [rank, outputs...] folded in: ``kernel + scale * a b``, in float32 (stacked layers: a
    leading layer axis on all three)."""
    if a.ndim + b.ndim - kernel.ndim == 3:  # a leading layer axis on each
        return np.stack([merge_adapter(k, x, y, scale)
                         for k, x, y in zip(kernel, a, b, strict=True)])
    inputs = a.shape[:-1]
    product = np.reshape(a, (math.prod(inputs), a.shape[-1])) @ np.reshape(b, (b.shape[0], -1))
    return (kernel.astype(np.float32) + scale * product.reshape(kernel.shape)).astype(np.float32)
