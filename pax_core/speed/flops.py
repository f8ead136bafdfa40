"""FLOPs of a train step: the model's analytic count and the compiled program's count.

Two numbers, for two utilisations:

- *Model* FLOPs come from the model's own formula (``flops_per_step``), the same whatever the
  sharding, remat or compiler does: MFU compares runs and frameworks with it.
- *Hardware* FLOPs are what the compiled program executes, from XLA's cost analysis: HFU shows
  how busy the chips are, recomputation included.

XLA's cost analysis counts a ``while`` loop's body once, whatever its trip count, and scanned
layers and microbatch accumulation both compile to such loops; and it has no cost for a Pallas
kernel's custom call (Splash attention on TPUs). ``hardware_flops`` adds what it misses from the
compiled HLO: for every loop with a known trip count it counts what its body runs (matrix
products as 2 x output x contracted size, elementwise arithmetic and reductions as one FLOP per
element, as XLA does; a padded convolution's taps on the padding are counted, which XLA leaves
out) and adds that ``trip count - 1`` more times, and it counts every execution of a kernel by
``pax_core.speed.hlo.kernel_flops``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax

from pax_core.speed import hlo

# Opcodes XLA's cost analysis counts as one FLOP per output element (transcendental functions
# it counts apart, as "transcendentals").
_ELEMENTWISE = frozenset({
    "add", "subtract", "multiply", "divide", "remainder", "maximum", "minimum", "negate", "abs",
    "sign", "floor", "ceil", "round-nearest-afz", "round-nearest-even", "compare", "select",
    "clamp", "and", "or", "xor", "not",
})


@dataclasses.dataclass(frozen=True)
class StepFlops:
    """FLOPs of one train step over all devices, and what they were counted with."""

    model: float | None
    formula: str | None
    hardware: float | None


def _own_flops(module: hlo.Module, comp: hlo.Computation) -> float:
    """FLOPs of a computation's own instructions as XLA counts them (callees not included)."""
    total = 0.0
    for instruction in comp.instructions.values():
        if instruction.opcode in ("dot", "convolution"):
            total += hlo.product_flops(module, comp, instruction)
        elif instruction.opcode in _ELEMENTWISE:
            total += math.prod(hlo.shape_dims(instruction.shape))
        elif instruction.opcode == "reduce" and instruction.operands:
            total += math.prod(hlo.shape_dims(module.shape_of(comp, instruction.operands[0])))
    return total


def loop_correction(hlo_text: str) -> float:
    """The FLOPs XLA's analysis leaves out: loop iterations after the first, and every
    execution of a fused kernel it has no cost for (``hlo.kernel_flops``: Splash attention)."""
    module = hlo.parse(hlo_text)
    totals: dict[str, tuple[float, float]] = {}

    def walk(name: str) -> tuple[float, float]:
        """(FLOPs of one execution, FLOPs missed by counting loop bodies once)."""
        if name in totals:
            return totals[name]
        totals[name] = (0.0, 0.0)  # guards against a malformed, recursive module
        comp = module.computations.get(name)
        if comp is None:
            return totals[name]
        kernels = sum(hlo.kernel_flops(module, comp, i) for i in comp.instructions.values())
        flops, missed = _own_flops(module, comp) + kernels, kernels
        for instruction in comp.instructions.values():
            loop = hlo.loop_of(module, instruction)
            if loop is not None:
                f, m = walk(loop[0])
                flops += loop[1] * f
                missed += (loop[1] - 1) * f + m  # XLA counted one iteration, m short
                continue
            for callee in instruction.called():
                f, m = walk(callee)
                flops, missed = flops + f, missed + m
        totals[name] = (flops, missed)
        return totals[name]

    return walk(module.entry)[1] if module.entry else 0.0


def _cost_analysis_flops(compiled: Any) -> float | None:
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):  # older jax: one dict per program
        analysis = analysis[0] if analysis else None
    if not analysis or "flops" not in analysis:
        return None
    return float(analysis["flops"])


def hardware_flops(compiled: Any, num_devices: int) -> float | None:
    """FLOPs the compiled step executes on all devices (XLA's count per device, corrected for
    loops, times the devices); None where the backend has no cost analysis."""
    try:
        per_device = _cost_analysis_flops(compiled)
        if per_device is None:
            return None
        text = compiled.as_text()
    except Exception:  # a backend without cost analysis or HLO text: no HFU, not a failure
        return None
    return (per_device + loop_correction(text)) * num_devices


def model_flops(model: Any, batch_spec: dict[str, jax.ShapeDtypeStruct]
                ) -> tuple[float | None, str | None]:
    """The model's analytic training FLOPs for one global batch, and its formula's name.

    A model opts in by defining ``flops_per_step(batch_spec) -> float`` and ``flops_formula``
    (a name with a version, e.g. ``transformer-v1``, changed whenever the count changes).
    """
    count = getattr(model, "flops_per_step", None)
    if count is None:
        return None, None
    return float(count(batch_spec)), str(getattr(model, "flops_formula", "unnamed"))


def step_flops(model: Any, batch_spec: dict[str, jax.ShapeDtypeStruct], compiled: Any,
               num_devices: int) -> StepFlops:
    """Both counts for a run's compiled train step."""
    flops, formula = model_flops(model, batch_spec)
    return StepFlops(flops, formula, hardware_flops(compiled, num_devices))
