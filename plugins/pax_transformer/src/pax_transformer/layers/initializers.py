"""Weight initialisers, following Pax's defaults unless one ``init_std`` is given.

* dense kernels: fan-in scaled normal, std = 1/sqrt(fan_in), where fan_in is the product of the
  contracted dimensions (``dense.Projection`` hands the initialiser the flattened 2-D shape);
* embedding, softmax and learned-position tables: N(0, 1/sqrt(model_dims)) (Pax's softmax
  init; the embedding is then scaled by sqrt(model_dims) on lookup, giving unit-variance inputs);
* ``init_std`` set: N(0, init_std) for all of them (GPT-3 style, e.g. 0.006).

Norm scales start at one and biases at zero; those are not configurable.
"""

from __future__ import annotations

import math

import flax.linen as nn
from flax.typing import Initializer


def dense_init(init_std: float | None) -> Initializer:
    """Initialiser for projection kernels."""
    if init_std is None:
        return nn.initializers.variance_scaling(1.0, "fan_in", "normal")
    return nn.initializers.normal(init_std)


def table_init(model_dims: int, init_std: float | None) -> Initializer:
    """Initialiser for [vocab or length, model_dims] tables (embedding, softmax, positions)."""
    return nn.initializers.normal(1.0 / math.sqrt(model_dims) if init_std is None else init_std)


def partitioned(init: Initializer, names: tuple[str | None, ...]) -> Initializer:
    """``init`` whose values carry logical axis names for the SPMD partitioner."""
    return nn.with_logical_partitioning(init, names)
