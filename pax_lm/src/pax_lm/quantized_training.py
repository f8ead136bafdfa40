"""Int8 training (the LM experiments' ``QUANTIZE_TRAINING="int8"``): the blocks' matmuls as
int8 x int8 products, forward and backward, through Qwix's quantized training
(``qwix.QtProvider``), as AQT did for Pax.

Why: a TPU v5e multiplies int8 at twice its bfloat16 rate (394 against 197 TFLOP/s), and the
blocks' projections are most of a decoder's FLOPs (LlamaBench470M: 92 % of the weights'
products, the untied output projection the other 8 %).

Which matmuls: each block's attention projections (``attention/query``, ``key``, ``value``,
``out``) and dense feed-forward (``ffn/wi``, ``wi_gate``, ``wo``): the transformer's dense
layers, the ones AQT quantized for Pax. Each becomes three int8 x int8 products
(``dot_general``) accumulating in int32, every operand quantized symmetrically (absmax to
127) when it is used:

* forward: the activations (a scale per token) times the kernel (a scale per output channel);
* the activations' gradient: the incoming gradient (a scale per token) times the forward's
  int8 kernel;
* the kernel's gradient: the incoming gradient (a scale per output channel) times the
  forward's int8 activations.

The backward products reuse the forward's int8 operands (Qwix folds their scales into the
incoming gradient before quantizing it), so the only new rounding there is the gradient's;
it rounds to nearest. (AQT's recipe rounds gradients stochastically; Qwix can, given a
``stochastic_rounding`` rng stream, which Pax's train step does not pass.) The forward pass's
rounding is most of the error: on the quick-start model after 200 float steps, the gradients
differ from float's by 3.7 % (norm of the difference over float's) with int8 in both passes
and by 3.6 % with the forward pass's alone; a scale per tile of 1/4 or 1/16 of the tokens
for the kernel's gradient (Qwix's ``bwd_weight_grad_tile_size``) left that unchanged.

What stays in ``FPROP_DTYPE``: the embedding lookup and the logits (a tied head is the
embedding table, and AQT for Pax left the embedding and softmax out too: the vocabulary
projection is where a rounding error reaches every token's loss directly), attention's own
products (scores and weighted values: two activations over a head's width, not weights),
norms and the loss.

The weights stay float32, the optimizer's state with them: int8 values exist only inside the
step, quantized afresh on each use, so a checkpoint is the plain model's and anything that
reads one (warm starts, ``pax export``, the hf format) sees an ordinary decoder. Decoding,
scoring and serving such a job run that plain decoder (``plain``, by ``commands/lm_jobs.py``):
int8 training is how a training step computes, not what the weights are; ``--quantize int8``
then gives int8 weights as for any job. Evaluation inside the training job (the held-out
``log_pplx``) runs the int8 forward pass the job trains with.

The decoder is wrapped by ``qwix.quantize_model``, which intercepts the matmuls inside the
modules whose paths match, whatever lifts them: a scanned stack (``USE_REPEATED_LAYER``) and
rematerialisation (``CHECKPOINT_POLICY``) trace the same intercepted block, and so does
pax-pipeline's stage (tried on the tests' pipelined model). Not covered, and
refused rather than left partly float: FP8 projections (``USE_FP8``: one number format at a
time), low-rank adapters (``LORA_RANK``: the frozen base and the adapters' products) and
sparse feed-forward parts (``NUM_EXPERTS``: the experts' grouped matmuls).
"""

from __future__ import annotations

import functools
from typing import Any

from pax_core import UsageError
from pax_lm.quantization import BLOCK_PROJECTIONS, TensordotMixin

MODES = ("int8",)

# The modules whose matmuls train in int8: the blocks' projections, wherever they sit.
QUANTIZED = rf"(.*/)?({BLOCK_PROJECTIONS})"


def check(mode: Any, decoder: Any) -> None:
    """Refuse a ``QUANTIZE_TRAINING`` that is not None or one of ``MODES``, or a ``decoder``
    (a ``TransformerLm`` or its Fiddle config) that int8 training does not cover; UsageError
    naming the constants to change."""
    if mode is not None and mode not in MODES:
        choices = " or ".join(["None", *map(repr, MODES)])
        raise UsageError(f"QUANTIZE_TRAINING must be {choices}, got {mode!r}")
    if mode is None:
        return
    setting = f"QUANTIZE_TRAINING={mode!r}"
    if getattr(decoder, "fp8", False):
        raise UsageError(f"{setting} and USE_FP8 each choose the projections' number format; "
                         f"set one of them")
    if getattr(decoder, "lora_rank", 0):
        raise UsageError(f"{setting} trains every weight in int8 and LORA_RANK trains adapters "
                         f"on a frozen base, which int8 training does not cover; set one of "
                         f"them")
    if getattr(decoder, "feed_forward", None) is not None:
        raise UsageError(f"{setting} covers the dense feed-forward, not a feed-forward part of "
                         f"its own such as NUM_EXPERTS's experts; set one of them")


def for_training(decoder: Any, mode: str) -> Any:
    """``decoder`` (a ``TransformerLm``) computing its blocks' projections in int8, forward
    and backward; the same parameters, so its ``init`` and checkpoints are the plain
    decoder's. A decoder already wrapped is returned as it is (Flax clones modules often)."""
    check(mode, decoder)
    if _unwrapped_class(decoder) is not None:
        return decoder
    import qwix

    return qwix.quantize_model(decoder, _provider_class()(_rules(mode)))


def plain(decoder: Any) -> Any:
    """The decoder without int8 training (itself when it has none): the same fields, so the
    same parameters, computed in its ``dtype``."""
    import dataclasses

    base = _unwrapped_class(decoder)
    if base is None:
        return decoder
    fields = {f.name: getattr(decoder, f.name) for f in dataclasses.fields(base)
              if f.init and f.name not in ("parent", "name")}
    return base(**fields)


def _unwrapped_class(decoder: Any) -> type | None:
    """The class Qwix wrapped to make ``decoder``'s (None for a decoder it did not wrap)."""
    return getattr(type(decoder), "_unquantized_type", None)


def _rules(mode: str) -> list[Any]:
    """Qwix's rule for ``mode``: int8 weights, activations and gradients in the blocks'
    projections, every scale per channel (the defaults), rounding to nearest."""
    import qwix

    del mode  # int8, the one mode
    return [qwix.QtRule(module_path=QUANTIZED, weight_qtype="int8", act_qtype="int8",
                        bwd_qtype="int8")]


@functools.cache
def _provider_class() -> type:
    """Qwix's training provider with the projections' ``jnp.tensordot`` taken to its
    ``dot_general`` (``TensordotMixin``). Built on first use, so that importing this module
    imports neither JAX nor Qwix."""
    import qwix

    class Int8TrainingProvider(TensordotMixin, qwix.QtProvider):
        pass

    return Int8TrainingProvider
