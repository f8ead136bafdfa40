"""A reader of compiled (optimised, per-device) HLO text: the costs a step's program runs.

``pax plan`` compiles a train step for the target mesh on fake CPU devices; XLA's SPMD
partitioner has then decided every collective and every per-device shape exactly as it would
for the accelerators. This module reads that program: each top-level operation of every
computation, how many times a step runs it (``while`` loops of scanned layers and microbatches
run their body once per iteration), its matrix-product FLOPs, the bytes it moves through memory
(a fusion reads its operands and writes its result once), and for each collective its kind,
payload and replica groups (as device positions in the mesh).

Two things the CPU compiler does differently from the accelerators' are undone here, so the
costs are those of the program a TPU or GPU would run:

- it upcasts bfloat16 products to float32 through ``convert`` fusions: a fusion that only
  converts is not counted;
- it leaves an all-reduce followed by a per-device slice as it is, where the accelerators'
  compilers make it a reduce-scatter: such an all-reduce is read as the reduce-scatter.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable

import numpy as np

_COMPUTATION = re.compile(r"^(ENTRY )?%?([\w.\-]+) \((.*)\) -> (.*) \{$")
_INSTRUCTION = re.compile(r"^\s*(ROOT )?%([\w.\-]+) = (.*)$")
_OPCODE = re.compile(r"\s*([a-z][\w\-]*)\(")
_ARRAY = re.compile(r"\b(pred|token|[suf]\d+|bf16|f8\w*|c64|c128)\[([\d,]*)\]")
_OPERANDS = re.compile(r"%([\w.\-]+)")
_CALLED = re.compile(
    r"(?:calls|to_apply|body|condition|branch_computations)=\{?(%[^}\s]+(?:, %[^}\s]+)*)")
_BODY = re.compile(r"body=%([\w.\-]+)")
_CONDITION = re.compile(r"condition=%([\w.\-]+)")
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_LHS_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_DIM_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
# Splash attention's Pallas kernels, by the name XLA gives their custom calls, with how many
# [T, S] x H matrix products each computes: the forward pass (scores, then values), the query
# gradient (scores, probabilities' gradient, then queries') and the key and value gradients
# (scores, values', probabilities', keys').
_SPLASH_PRODUCTS = {"splash_mha_fwd": 2, "splash_mha_dq": 3, "splash_mha_dkv": 4}

# Bytes per element; 4-bit types are counted as half a byte.
_ITEM_BYTES = {"pred": 1, "token": 0, "bf16": 2, "f16": 2, "c64": 8, "c128": 16}
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
# Operations that move no data through memory or only name other values.
_FREE = frozenset({
    "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "call",
    "conditional", "after-all", "partition-id", "replica-id", "opt-barrier", "copy-start",
    "copy-done", "add-dependency", "domain",
})
# Operations that only change a value's type or layout: followed through when deciding whether
# an all-reduce's results are sliced and what a fusion slices or updates.
_RETYPE = frozenset({"convert", "bitcast", "copy", "reshape"})


def item_bytes(dtype: str) -> float:
    if dtype in _ITEM_BYTES:
        return _ITEM_BYTES[dtype]
    if dtype.startswith("f8"):
        return 1
    bits = int(re.sub(r"\D", "", dtype) or 32)
    return bits / 8


def shape_bytes(shape: str) -> float:
    """Bytes of an HLO shape: an array, or a tuple of arrays (summed)."""
    return sum(math.prod(int(d) for d in dims.split(",") if d) * item_bytes(dtype)
               for dtype, dims in _ARRAY.findall(shape))


def shape_dims(shape: str) -> list[int]:
    match = _ARRAY.search(shape)
    return [int(d) for d in match.group(2).split(",") if d] if match else []


@dataclasses.dataclass
class Instruction:
    name: str
    opcode: str
    shape: str  # the result's shape text
    operands: list[str]
    args: str  # the text between the opcode's parentheses
    attributes: str  # the text after them
    root: bool = False

    @property
    def label(self) -> str:
        """Where the operation comes from: the JAX operation name, shortened to its last parts."""
        match = _OP_NAME.search(self.attributes)
        if not match:
            return self.name
        parts = [p.rstrip(")") for p in match.group(1).split("/") if p and "(" not in p]
        return "/".join(parts[-3:]) or self.name

    def called(self) -> list[str]:
        return [name.strip().lstrip("%") for match in _CALLED.findall(self.attributes)
                for name in match.split(",")]


@dataclasses.dataclass
class Computation:
    name: str
    params: dict[str, str]  # parameter name -> shape
    instructions: dict[str, Instruction]
    entry: bool = False

    def users(self) -> dict[str, list[Instruction]]:
        found: dict[str, list[Instruction]] = {}
        for instruction in self.instructions.values():
            for operand in instruction.operands:
                found.setdefault(operand, []).append(instruction)
        return found


@dataclasses.dataclass
class Module:
    computations: dict[str, Computation]
    entry: str

    def shape_of(self, computation: Computation, name: str) -> str:
        if name in computation.instructions:
            return computation.instructions[name].shape
        return computation.params.get(name, "")


def _split_shape(rhs: str) -> tuple[str, str]:
    """``(shape text, the rest)`` of an instruction's right-hand side (tuple shapes nest)."""
    if rhs.startswith("("):
        depth = 0
        for i, char in enumerate(rhs):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                return rhs[:i + 1], rhs[i + 1:]
    shape, _, rest = rhs.partition(" ")
    return shape, " " + rest


def parse(text: str) -> Module:
    """The computations of an HLO module's text, with their instructions in order."""
    computations: dict[str, Computation] = {}
    entry = ""
    current: Computation | None = None
    for line in text.splitlines():
        if header := _COMPUTATION.match(line):
            params = dict(re.findall(r"([\w.\-]+): ((?:\([^)]*\))|[^,()]+(?:\{[^}]*\})?)",
                                     header.group(3)))
            current = Computation(header.group(2), params, {}, bool(header.group(1)))
            computations[current.name] = current
            if current.entry:
                entry = current.name
            continue
        if current is None or not (match := _INSTRUCTION.match(line)):
            continue
        root, name, rhs = match.groups()
        shape, rest = _split_shape(rhs)
        opcode = _OPCODE.match(rest)
        if not opcode:
            continue
        after = rest[opcode.end():]
        depth, end = 1, len(after)
        for i, char in enumerate(after):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                end = i
                break
        current.instructions[name] = Instruction(
            name, opcode.group(1), shape, _OPERANDS.findall(after[:end]), after[:end],
            after[end + 1:], bool(root))
    return Module(computations, entry)


# -- replica groups ---------------------------------------------------------------------------

_IOTA = re.compile(r"\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_MESH = re.compile(
    r"mesh\[([^\]]*)\](?:, device_ids=\(((?:[^()]|\([^()]*\))*)\))?(?: \{([^}]*)\})?")


def _iota(reshape: list[int], transpose: list[int] | None) -> np.ndarray:
    ids = np.arange(math.prod(reshape)).reshape(reshape)
    return ids.transpose(transpose) if transpose else ids


def replica_groups(attributes: str, num_devices: int) -> list[list[int]]:
    """The groups of device positions a collective runs over, in any of XLA's spellings:
    explicit (``{{0,1},{2,3}}``), iota (``[2,4]<=[8]``, ``[4,2]<=[2,4]T(1,0)``) or named mesh
    axes (``mesh['axis_0'=2,'axis_1'=4] {'axis_1'}``). No groups means one group of all."""
    text = attributes.split("replica_groups=", 1)
    if len(text) < 2:
        return [list(range(num_devices))]
    spec = text[1]
    if spec.startswith("{"):
        body = spec[1:spec.index("}}") + 1] if "}}" in spec else ""
        groups = [[int(x) for x in g.split(",") if x] for g in re.findall(r"\{([\d,]*)\}", body)]
        groups = [g for g in groups if g]
        return groups or [list(range(num_devices))]
    if spec.startswith("["):
        match = _IOTA.match(spec)
        shape = [int(x) for x in match.group(1).split(",")]
        ids = _iota([int(x) for x in match.group(2).split(",")],
                    [int(x) for x in match.group(3).split(",")] if match.group(3) else None)
        return ids.reshape(shape).tolist()
    match = _MESH.match(spec)
    axes = [(name.strip("' "), int(size)) for name, size in
            (item.split("=") for item in match.group(1).split(",") if "=" in item)]
    sizes = [size for _, size in axes]
    if match.group(2):
        inner = _IOTA.match(f"[{math.prod(sizes)}]<={match.group(2)}") if "[" in match.group(2) \
            else None
        ids = (_iota([int(x) for x in inner.group(2).split(",")],
                     [int(x) for x in inner.group(3).split(",")] if inner.group(3) else None)
               if inner else np.array([int(x) for x in re.findall(r"\d+", match.group(2))]))
        ids = ids.reshape(sizes)
    else:
        ids = np.arange(math.prod(sizes)).reshape(sizes)
    grouped = [i for i, (name, _) in enumerate(axes)
               if match.group(3) and f"'{name}'" in match.group(3)]
    if not grouped:
        return [[int(x)] for x in ids.flatten()]
    others = [i for i in range(len(axes)) if i not in grouped]
    return ids.transpose(others + grouped).reshape(-1, math.prod(sizes[i] for i in grouped)
                                                   ).tolist()


def permute_pairs(attributes: str) -> list[tuple[int, int]]:
    match = re.search(r"source_target_pairs=\{(.*?)\}\}", attributes)
    if not match:
        return []
    return [(int(a), int(b)) for a, b in re.findall(r"\{?(\d+),(\d+)", match.group(1) + "}")]


# -- costs ------------------------------------------------------------------------------------

@dataclasses.dataclass
class Collective:
    kind: str  # one of COLLECTIVES
    payload_bytes: float  # the whole array the formula counts (see ``collective_payload``)
    groups: list[list[int]]
    pairs: list[tuple[int, int]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Cost:
    """One top-level operation of a step's program and what one execution of it costs."""

    name: str
    label: str
    computation: str
    executions: int  # per step: the product of the trip counts of the loops around it
    in_loop: bool
    flops: float
    bytes: float
    collective: Collective | None = None


def product_flops(module: Module, comp: Computation, instruction: Instruction) -> float:
    """2 x output elements x contracted size, for a ``dot`` or a ``convolution``."""
    out = math.prod(shape_dims(instruction.shape))
    operands = instruction.operands
    if instruction.opcode == "dot":
        contracting = _LHS_CONTRACTING.search(instruction.attributes)
        lhs = shape_dims(module.shape_of(comp, operands[0])) if operands else []
        if contracting is None or not lhs:
            return 0.0
        return 2.0 * out * math.prod(lhs[int(d)] for d in contracting.group(1).split(",") if d)
    kernel = shape_dims(module.shape_of(comp, operands[1])) if len(operands) > 1 else []
    labels = _DIM_LABELS.search(instruction.attributes)
    lhs = shape_dims(module.shape_of(comp, operands[0])) if operands else []
    if not kernel or not labels or not lhs:
        return 0.0
    return 2.0 * _convolution_macs(lhs, kernel, shape_dims(instruction.shape),
                                   labels.groups(), instruction.attributes)


def _convolution_macs(lhs: list[int], kernel: list[int], out: list[int],
                      labels: tuple[str, str, str], attributes: str) -> float:
    """Multiply-adds of a convolution that touch its input, not its padding (XLA's count).

    The TPU compiler writes matrix products as convolutions, some with a padded window over
    the heads (``window={size=1x16 pad=0_0x15_15}``), whose taps fall on the padding but for
    one in each output position: counting every tap would count 16 times the work."""
    lhs_labels, rhs_labels, out_labels = labels
    if len(lhs_labels) != len(lhs) or len(rhs_labels) != len(kernel) or len(
            out_labels) != len(out) or "i" not in rhs_labels:
        return 0.0
    spatial = sorted(c for c in rhs_labels if c.isdigit())
    window = _WINDOW.search(attributes)
    fields = dict(re.findall(r"(\w+)=([\w\-]+)", window.group(1))) if window else {}
    pads = [tuple(int(p) for p in pair.split("_")) for pair in fields["pad"].split("x")] \
        if "pad" in fields else [(0, 0)] * len(spatial)

    def each(name: str) -> list[int]:
        return [int(x) for x in fields[name].split("x")] if name in fields else [1] * len(spatial)

    strides, lhs_dilation, rhs_dilation = each("stride"), each("lhs_dilate"), each("rhs_dilate")
    macs = math.prod(out) * kernel[rhs_labels.index("i")]
    for d, label in enumerate(spatial):
        size, taps = lhs[lhs_labels.index(label)], kernel[rhs_labels.index(label)]
        positions, low, step = out[out_labels.index(label)], pads[d][0], lhs_dilation[d]
        touching = sum(1 for o in range(positions) for k in range(taps)
                       if 0 <= (i := o * strides[d] + k * rhs_dilation[d] - low)
                       <= (size - 1) * step and i % step == 0)
        macs *= touching / positions
    return macs


def kernel_flops(module: Module, comp: Computation, instruction: Instruction) -> float:
    """FLOPs of a fused kernel's custom call that XLA has no cost for: a Splash attention
    kernel counts as the dense products it stands for, 2 x B x N x T x S x H each (the blocks
    its mask skips are counted, as the model's formula counts attention), from its query
    [B, N, T, H] and key [B, K, S, H] operands; 0 for any other."""
    if instruction.opcode != "custom-call":
        return 0.0
    products = next((n for prefix, n in _SPLASH_PRODUCTS.items()
                     if instruction.name.startswith(prefix)), 0)
    if not products:
        return 0.0
    tensors = [dims for dims in (shape_dims(module.shape_of(comp, o))
                                 for o in instruction.operands) if len(dims) == 4]
    if len(tensors) < 2:
        return 0.0
    (batch, heads, length, dims), keys = tensors[0], tensors[1]
    return 2.0 * products * batch * heads * length * keys[2] * dims


def _fused_flops(module: Module, name: str) -> float:
    comp = module.computations.get(name)
    if comp is None:
        return 0.0
    total = 0.0
    for instruction in comp.instructions.values():
        if instruction.opcode in ("dot", "convolution"):
            total += product_flops(module, comp, instruction)
        elif instruction.opcode == "fusion":
            total += sum(_fused_flops(module, c) for c in instruction.called())
    return total


def _only_converts(module: Module, name: str) -> bool:
    """Whether a fused computation only changes its parameters' types or layouts."""
    comp = module.computations.get(name)
    return comp is not None and all(i.opcode in _RETYPE | {"parameter", "tuple"}
                                    for i in comp.instructions.values())


def _param_sliced(module: Module, fused: str, index: int) -> bool:
    """Whether a fusion's parameter ``index`` reaches only ``dynamic-slice`` (as the sliced
    operand) through type and layout changes."""
    comp = module.computations.get(fused)
    if comp is None:
        return False
    users = comp.users()
    starts = [i.name for i in comp.instructions.values()
              if i.opcode == "parameter" and i.args.strip() == str(index)]
    return bool(starts) and all(_sliced(comp, users, s, module) for s in starts)


def _sliced(comp: Computation, users: dict[str, list[Instruction]], name: str,
            module: Module) -> bool:
    """Whether every use of ``name`` (through retyping, tuple elements and fusions) is the
    sliced operand of a ``dynamic-slice``: each device keeps a slice of it."""
    following = users.get(name, [])
    if not following:
        return False
    for user in following:
        if user.opcode == "dynamic-slice" and user.operands[0] == name:
            continue
        if user.opcode in _RETYPE | {"get-tuple-element"}:
            if not _sliced(comp, users, user.name, module):
                return False
            continue
        if user.opcode == "fusion":
            if _only_converts(module, user.called()[0]):
                if not _sliced(comp, users, user.name, module):
                    return False
                continue
            if all(_param_sliced(module, user.called()[0], i)
                   for i, operand in enumerate(user.operands) if operand == name):
                continue
        return False
    return True


def collective_payload(module: Module, comp: Computation, instruction: Instruction,
                       kind: str) -> float:
    """The array a collective's cost formula counts: the gathered result of an all-gather, the
    unreduced operand of a reduce-scatter, the reduced buffer of an all-reduce, the buffer each
    device exchanges in an all-to-all, the buffer sent by a collective-permute."""
    if kind == "all-gather":
        return shape_bytes(instruction.shape)
    return sum(shape_bytes(module.shape_of(comp, o)) for o in instruction.operands)


def _source(comp: Computation, name: str) -> str:
    """The value ``name`` is a retyped or relaid copy of (the CPU compiler converts bfloat16
    buffers to float32 around a slice or an update)."""
    while (i := comp.instructions.get(name)) is not None and i.opcode in _RETYPE:
        name = i.operands[0]
    return name


def _readers(comp: Computation, users: dict[str, list[Instruction]], name: str
             ) -> list[tuple[Instruction, str]]:
    """The operations that read ``name``, through type and layout changes, with the name
    each reads it by."""
    found = []
    for user in users.get(name, []):
        if user.opcode in _RETYPE:
            found.extend(_readers(comp, users, user.name))
        else:
            found.append((user, name))
    return found


def _moved_bytes(module: Module, comp: Computation, instruction: Instruction,
                 on_chip: Callable[[str], bool] = lambda name: False,
                 write: bool = True) -> float:
    """Bytes an operation reads and writes in memory: each operand and its result once, but
    only the slice of an operand that a ``dynamic-slice`` reads, and only the update of a buffer
    that a ``dynamic-update-slice`` writes in place (a scanned layer's weights, activations and
    gradients are such slices of stacked arrays). Operands that ``on_chip`` names are not
    read from memory, and without ``write`` the result is not written to it."""
    fused = (module.computations.get(instruction.called()[0])
             if instruction.opcode == "fusion" and instruction.called() else None)
    if instruction.opcode == "dynamic-slice":  # reads the slice, writes it
        return 2 * shape_bytes(instruction.shape)
    if instruction.opcode == "dynamic-update-slice":  # reads the update, writes it in place
        return 2 * shape_bytes(module.shape_of(comp, instruction.operands[1]))
    if fused is None:
        return (sum(shape_bytes(module.shape_of(comp, o)) for o in instruction.operands
                    if not on_chip(o)) + write * shape_bytes(instruction.shape))
    params = {int(i.args): i.name for i in fused.instructions.values()
              if i.opcode == "parameter" and i.args.strip().isdigit()}
    users = fused.users()
    root = next((i for i in fused.instructions.values() if i.root), None)
    root = fused.instructions.get(_source(fused, root.name)) if root is not None else None
    updated = (_source(fused, root.operands[0]) if root is not None
               and root.opcode == "dynamic-update-slice" else None)
    total = 0.0
    for index, operand in enumerate(instruction.operands):
        name = params.get(index, "")
        if (name and name == updated) or on_chip(operand):
            continue  # updated in place, or kept on chip
        readers = _readers(fused, users, name) if name else []
        if readers and all(u.opcode == "dynamic-slice" and u.operands[0] == via
                           for u, via in readers):
            total += sum(shape_bytes(u.shape) for u, _ in readers)
        else:
            total += shape_bytes(module.shape_of(comp, operand))
    if updated is not None:
        return total + shape_bytes(module.shape_of(fused, root.operands[1]))
    return total + write * shape_bytes(instruction.shape)


def _trip_count(module: Module, instruction: Instruction) -> int:
    """A loop's trip count: XLA's note of it, else the constant its condition compares the
    counter with (``i < N``, also inside a fusion of the condition, as the TPU and CPU
    compilers write it), else 1."""
    trips = _TRIP_COUNT.search(instruction.attributes)
    if trips:
        return int(trips.group(1))
    condition = _CONDITION.search(instruction.attributes)
    return (_compared_bound(module, condition.group(1), {}) if condition else None) or 1


def _compared_bound(module: Module, name: str, passed: dict[int, str | None]) -> int | None:
    """The integer constant that computation ``name`` compares something with ``LT``;
    ``passed`` holds the constants its caller gives its parameters, by their index."""
    comp = module.computations.get(name)
    if comp is None:
        return None

    def constant(value: str) -> str | None:
        found = comp.instructions.get(value)
        if found is None:
            return None
        if found.opcode == "parameter":
            return passed.get(int(found.args.strip() or -1))
        text = found.args.strip()
        return text if found.opcode == "constant" and text.isdigit() else None

    for instruction in comp.instructions.values():
        if (instruction.opcode == "compare" and "direction=LT" in instruction.attributes
                and (bound := constant(instruction.operands[-1])) is not None):
            return int(bound)
        for callee in instruction.called():
            inner = {i: constant(o) for i, o in enumerate(instruction.operands)}
            if callee != name and (bound := _compared_bound(module, callee, inner)) is not None:
                return bound
    return None


def _flops(module: Module, comp: Computation, instruction: Instruction) -> float:
    if instruction.opcode in ("dot", "convolution"):
        return product_flops(module, comp, instruction)
    if instruction.opcode == "custom-call":
        return kernel_flops(module, comp, instruction)
    if instruction.opcode == "fusion":
        return sum(_fused_flops(module, c) for c in instruction.called())
    return 0.0


def step_costs(text: str, num_devices: int, kernels: tuple[str, ...] = ()) -> list[Cost]:
    """Every top-level operation a step runs, with its execution count, FLOPs, bytes and (for
    collectives) groups; fusions' insides are counted in the fusion.

    Elementwise work and reductions between matrix products are taken as fused, as XLA fuses
    them on TPUs and GPUs (the CPU compiler fuses less): a value one such operation makes and
    only such operations read stays on chip, so only what a matrix product, a collective or the
    loop state reads or writes goes through memory. The operations named under one of
    ``kernels`` (a name scope, such as the attention's) are one fused kernel: what they pass
    among themselves stays on chip too."""
    module = parse(text)
    costs: list[Cost] = []

    def walk(name: str, executions: int, in_loop: bool, seen: tuple[str, ...]) -> None:
        comp = module.computations.get(name)
        if comp is None or name in seen:
            return
        users = comp.users()
        flops = {i.name: _flops(module, comp, i) for i in comp.instructions.values()}

        def computes(instruction: Instruction | None) -> bool:
            return (instruction is not None and instruction.opcode not in _FREE
                    and instruction.opcode.removesuffix("-start") not in COLLECTIVES
                    and not instruction.opcode.endswith("-done"))

        def in_kernel(instruction: Instruction | None) -> bool:
            return computes(instruction) and any(
                f"/{k}/" in instruction.attributes for k in kernels)

        def elementwise(value: str) -> bool:
            producer = comp.instructions.get(value)
            return computes(producer) and not flops[value]

        def kept(reader: Instruction) -> Callable[[str], bool]:
            """Whether ``reader`` finds an operand on chip."""
            inside = in_kernel(reader)
            return lambda value: elementwise(value) or (
                inside and in_kernel(comp.instructions.get(value)))

        for instruction in comp.instructions.values():
            op = instruction.opcode
            if op == "while":
                if (loop := loop_of(module, instruction)) is not None:
                    walk(loop[0], executions * loop[1], True, (*seen, name))
                continue
            if op in ("call", "conditional", "async-start"):
                for callee in instruction.called():
                    walk(callee, executions, in_loop, (*seen, name))
                continue
            if op in _FREE or op.endswith("-done"):
                continue
            kind = op.removesuffix("-start")
            if kind in COLLECTIVES:
                if kind == "all-reduce" and _sliced(comp, users, instruction.name, module):
                    kind = "reduce-scatter"
                collective = Collective(
                    kind, collective_payload(module, comp, instruction, kind),
                    replica_groups(instruction.attributes, num_devices),
                    permute_pairs(instruction.attributes) if kind == "collective-permute" else [])
                costs.append(Cost(instruction.name, instruction.label, name, executions, in_loop,
                                  0.0, 0.0, collective))
                continue
            readers = users.get(instruction.name, [])
            if flops[instruction.name] and not in_kernel(instruction):
                moved = _moved_bytes(module, comp, instruction)
            else:
                moved = _moved_bytes(module, comp, instruction, kept(instruction), write=(
                    instruction.root or not readers
                    or not all(kept(r)(instruction.name) for r in readers)))
            costs.append(Cost(instruction.name, instruction.label, name, executions, in_loop,
                              flops[instruction.name], moved))

    walk(module.entry, 1, False, ())
    return costs


def loop_of(module: Module, instruction: Instruction) -> tuple[str, int] | None:
    """``(body, trip count)`` of a ``while`` instruction (``_trip_count``), else None."""
    if instruction.opcode != "while" or not (body := _BODY.search(instruction.attributes)):
        return None
    return body.group(1), _trip_count(module, instruction)
