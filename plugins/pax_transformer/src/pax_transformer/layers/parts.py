"""A block's swappable parts: how a part template is completed, and what a part says of its size.

A transformer block holds an attention part and a feed-forward part. Each is given as a
*template*, as praxis gives its layers: a Flax module class, or a ``functools.partial`` of one
(``fdl.Partial`` in an experiment's config, so ``--set`` reaches its fields). The block completes
the template with the settings it owns (the widths, the initializer, the dtypes, ...; see
``BlockConfig.attention_part`` and ``feed_forward_part``): every one the part declares as a
field and the template leaves unset. So a Mixture-of-Experts feed-forward or a LoRA projection
is one new layer and a line of configuration, not an edit of the block, the stack, the
parameter count and the FLOP formula.

A part answers for its size from its fields alone (no tracing), so that parameter counts and
FLOP formulas come from the parts:

* ``num_weights(model_dims)``: the weights it holds;
* ``train_flops_per_token(model_dims, seq_len)``: training FLOPs (forward and backward) one
  token costs in it: 6 per weight the token multiplies (all of them for a dense part, its
  chosen experts' for a sparse one), plus any work that is not a weight's (attention's scores
  and weighted values);
* ``active_weights(model_dims)``, a sparse part's only: the weights one token multiplies (a
  part without it multiplies all of them).

A sparse part returns ``(output, stats)`` instead of its output: ``stats`` a dict of arrays
about its routing, which the block hands up the stack (``layers/moe.py`` says what
``MoeFeedForward`` reports).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any, Protocol

import flax.linen as nn
import jax

PartStats = dict[str, jax.Array]


class Part(Protocol):
    """What the block and the size accounting ask of a part, beside being a Flax module."""

    def num_weights(self, model_dims: int) -> int:
        """The weights the part holds, over ``model_dims``-wide activations."""

    def train_flops_per_token(self, model_dims: int, seq_len: int) -> float:
        """Training FLOPs one token costs in the part, in rows of ``seq_len`` tokens."""


def build_part(template: Any, given: Mapping[str, Any], **kwargs: Any) -> nn.Module:
    """``template`` (a module class or a ``functools.partial`` of one) completed with the
    entries of ``given`` that it declares as fields and does not set itself; ``kwargs`` (a
    name) pass through."""
    target = template.func if isinstance(template, functools.partial) else template
    if not (isinstance(target, type) and issubclass(target, nn.Module)):
        raise ValueError(f"a block part must be a Flax module class or a partial of one "
                         f"(fdl.Partial), got {template!r}")
    declared = {field.name for field in dataclasses.fields(target)}
    preset = template.keywords if isinstance(template, functools.partial) else {}
    fill = {k: v for k, v in given.items() if k in declared and k not in preset}
    part = template(**fill, **kwargs)
    for method in ("num_weights", "train_flops_per_token"):
        if not callable(getattr(part, method, None)):
            raise ValueError(f"block part {target.__name__} has no {method}() method, which "
                             f"the parameter count and FLOP formula ask every part for")
    return part


def part_output(result: jax.Array | tuple[jax.Array, PartStats]
                ) -> tuple[jax.Array, PartStats | None]:
    """A part's ``(output, stats)``: a dense part's output has no stats."""
    return result if isinstance(result, tuple) else (result, None)


def active_weights(part: nn.Module, model_dims: int) -> int:
    """The weights one token multiplies in ``part``: a sparse part's ``active_weights``, all of
    them for a dense one."""
    count = getattr(part, "active_weights", None)
    return count(model_dims) if callable(count) else part.num_weights(model_dims)
