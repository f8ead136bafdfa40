"""FLOPs of a train step: the model's analytic count and the compiled program's count.

Two numbers, for two utilisations:

- *Model* FLOPs come from the model's own formula (``flops_per_step``), the same whatever the
  sharding, remat or compiler does: MFU compares runs and frameworks with it.
- *Hardware* FLOPs are what the compiled program executes, from XLA's cost analysis: HFU shows
  how busy the chips are, recomputation included.

XLA's cost analysis counts a ``while`` loop's body once, whatever its trip count, and scanned
layers and microbatch accumulation both compile to such loops. ``hardware_flops`` adds the
missing iterations from the compiled HLO: for every loop with a known trip count it counts what
its body runs (matrix products as 2 x output x contracted size, elementwise arithmetic and
reductions as one FLOP per element, as XLA does; a padded convolution's taps on the padding are
counted, which XLA leaves out) and adds that ``trip count - 1`` more times.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import jax

_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \((.*)\) -> .* \{$")
_PARAM = re.compile(r"([\w.\-]+): ([a-z0-9]+\[[\d,]*\])")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$")
_OPCODE = re.compile(r"(?:^|[\s}])([a-z][\w\-]*)\((?=%|\))")
_SHAPE = re.compile(r"[a-z0-9]+\[([\d,]*)\]")
_OPERANDS = re.compile(r"%([\w.\-]+)")
_CALLED = re.compile(r"(?:calls|to_apply|body|branch_computations)=\{?%([\w.\-]+)")
_BODY = re.compile(r"body=%([\w.\-]+)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_LHS_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_WINDOW_SIZE = re.compile(r"window=\{size=([\dx]+)")
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


def _dims(shape: str) -> list[int]:
    match = _SHAPE.match(shape)
    return [int(d) for d in match.group(1).split(",") if d] if match else []


def _operands(rest: str) -> list[str]:
    """Operand names of an instruction, from the text after its opcode's parenthesis."""
    return _OPERANDS.findall(rest.split(")", 1)[0])


@dataclasses.dataclass
class _Computation:
    flops: float = 0.0  # of this computation's own instructions, callees not included
    calls: list[str] = dataclasses.field(default_factory=list)
    loops: list[tuple[str, int]] = dataclasses.field(default_factory=list)


def _product_flops(op: str, out_shape: str, rest: str, shapes: dict[str, list[int]]) -> float:
    """2 x output elements x contracted size, for a ``dot`` or a ``convolution``."""
    out = math.prod(_dims(out_shape))
    operands = _operands(rest)
    if op == "dot":
        contracting = _LHS_CONTRACTING.search(rest)
        lhs = shapes.get(operands[0]) if operands else None
        if contracting is None or lhs is None:
            return 0.0
        size = math.prod(lhs[int(d)] for d in contracting.group(1).split(",") if d)
        return 2.0 * out * size
    window = _WINDOW_SIZE.search(rest)
    kernel = shapes.get(operands[1]) if len(operands) > 1 else None
    if kernel is None:
        return 0.0
    spatial = math.prod(int(s) for s in window.group(1).split("x")) if window else 1
    # The kernel holds spatial x input features x output features; the output features are in
    # ``out`` already.
    in_features = math.prod(kernel) // max(spatial, 1) // max(kernel[-1], 1)
    return 2.0 * out * spatial * in_features


def _parse(hlo_text: str) -> tuple[dict[str, _Computation], str | None]:
    computations: dict[str, _Computation] = {}
    entry = None
    current: _Computation | None = None
    shapes: dict[str, list[int]] = {}
    for line in hlo_text.splitlines():
        if header := _COMPUTATION.match(line):
            current = computations.setdefault(header.group(1), _Computation())
            shapes = {name: _dims(shape) for name, shape in _PARAM.findall(header.group(2))}
            if line.startswith("ENTRY"):
                entry = header.group(1)
            continue
        if current is None:
            continue
        instruction = _INSTRUCTION.match(line)
        if not instruction:
            continue
        name, rhs = instruction.groups()
        shape = _SHAPE.match(rhs)
        shape = shape.group(0) if shape else ""
        shapes[name] = _dims(shape)
        opcode = _OPCODE.search(rhs)
        if not opcode:
            continue
        op, rest = opcode.group(1), rhs[opcode.end():]
        if op in ("dot", "convolution"):
            current.flops += _product_flops(op, shape, rest, shapes)
        elif op in _ELEMENTWISE:
            current.flops += math.prod(_dims(shape))
        elif op == "reduce" and (operands := _operands(rest)) and operands[0] in shapes:
            current.flops += math.prod(shapes[operands[0]])
        if op == "while":
            body, trips = _BODY.search(rest), _TRIP_COUNT.search(rest)
            if body and trips:
                current.loops.append((body.group(1), int(trips.group(1))))
                continue
        current.calls.extend(_CALLED.findall(rest))
    return computations, entry


def loop_correction(hlo_text: str) -> float:
    """The FLOPs of loop iterations after the first, which XLA's analysis leaves out."""
    computations, entry = _parse(hlo_text)
    totals: dict[str, tuple[float, float]] = {}

    def walk(name: str) -> tuple[float, float]:
        """(FLOPs of one execution, FLOPs missed by counting loop bodies once)."""
        if name in totals:
            return totals[name]
        totals[name] = (0.0, 0.0)  # guards against a malformed, recursive module
        comp = computations.get(name)
        if comp is None:
            return totals[name]
        flops, missed = comp.flops, 0.0
        for callee in comp.calls:
            f, m = walk(callee)
            flops, missed = flops + f, missed + m
        for body, trips in comp.loops:
            f, m = walk(body)
            flops += trips * f
            missed += (trips - 1) * f + m  # XLA counted one iteration, m short
        totals[name] = (flops, missed)
        return totals[name]

    return walk(entry)[1] if entry else 0.0


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
    if '"known_trip_count"' in text:
        per_device += loop_correction(text)
    return per_device * num_devices


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
