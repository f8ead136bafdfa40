"""Pax's rematerialisation policies, by name, mapped onto ``jax.checkpoint_policies``.

A policy says which intermediates of a transformer block the backward pass keeps instead of
recomputing. The named ones refer to tensors tagged with ``jax.ad_checkpoint.checkpoint_name``
in ``attention.py``. Pax's combined QKV projection is split here into query, key and value (so
that grouped-query attention can have fewer key/value heads); its ``combined_qkv_proj`` name
becomes the three names below.

| Pax name                    | saved                                          |
| --------------------------- | ---------------------------------------------- |
| SAVE_NOTHING                | nothing: the whole block is recomputed         |
| SAVE_EVERYTHING             | everything: no recomputation (remat is a no-op)|
| SAVE_DOT_ONLY               | every matmul output                            |
| SAVE_DOT_WITH_NO_BATCH_DIM  | matmul outputs without batch dimensions        |
| SAVE_QKV_OUT_PROJ           | query/key/value and output projections         |
| SAVE_CONTEXT_AND_OUT_PROJ   | attention context and output projection        |
| SAVE_DOT_FOR_MLPERF_200B    | query/key/value, context and output projection |

The context is what the attention backend keeps for its backward pass, named
``pax_core.ATTENTION_RESIDUALS``: XLA's attention names its output, Splash (on a TPU) its
output and softmax statistics, without which the backward pass runs the kernel's forward pass
again (a fifth of the attention's time in a 470M model's step on a v5e). The layer does not
name the context a second time: Splash's output and the layer's context are the same numbers
in two layouts, and keeping both cost 1.5 % of that step (bench/results/tpu_profile.md).

Every policy also saves the rotary sines and cosines (``ROTATION``), computed from the
positions alone and so kept once for all the layers of a scanned stack.
"""

from __future__ import annotations

from collections.abc import Callable

import jax

from pax_core import ATTENTION_RESIDUALS
from pax_transformer.layers.validation import check_choice

QUERY_PROJ = "query_proj"
KEY_PROJ = "key_proj"
VALUE_PROJ = "value_proj"
OUT_PROJ = "out_proj"
# Rotary sines and cosines (``positions.rotation``): saved by every policy, see there.
ROTATION = "rotation"

_policies = jax.checkpoint_policies
POLICIES: dict[str, Callable[..., bool]] = {
    "SAVE_NOTHING": _policies.nothing_saveable,
    "SAVE_EVERYTHING": _policies.everything_saveable,
    "SAVE_DOT_ONLY": _policies.dots_saveable,
    "SAVE_DOT_WITH_NO_BATCH_DIM": _policies.dots_with_no_batch_dims_saveable,
    "SAVE_QKV_OUT_PROJ": _policies.save_only_these_names(
        QUERY_PROJ, KEY_PROJ, VALUE_PROJ, OUT_PROJ
    ),
    "SAVE_CONTEXT_AND_OUT_PROJ": _policies.save_only_these_names(
        ATTENTION_RESIDUALS, OUT_PROJ
    ),
    "SAVE_DOT_FOR_MLPERF_200B": _policies.save_only_these_names(
        QUERY_PROJ, KEY_PROJ, VALUE_PROJ, ATTENTION_RESIDUALS, OUT_PROJ
    ),
}


def remat_policy(name: str) -> Callable[..., bool]:
    """The ``jax.checkpoint`` policy for a Pax policy name, which also saves the rotary
    ``ROTATION``; ValueError listing the valid ones."""
    check_choice("remat_policy", name, POLICIES)
    return _policies.save_from_both_policies(POLICIES[name],
                                             _policies.save_only_these_names(ROTATION))
