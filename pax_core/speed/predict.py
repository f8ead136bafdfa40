"""A train step's time on hardware one does not have: a roofline of its computation and a
bandwidth and latency model of its collectives, read from the program compiled for the mesh.

Where the devices sit: every mesh axis is (DCN part) x (ICI part), as ``pax_core.parallel``
lays meshes out. On a TPU target the ICI part of the mesh is one slice's torus, each mesh axis
taking whole torus dimensions where their sizes allow (an axis over part of a dimension has no
wraparound link); the DCN part spans slices. On a GPU target the devices fill NVLink domains
(nodes) in order, and InfiniBand joins the domains.

The model, stated so it can be checked:

- **Computation**: each operation takes ``max(FLOPs / (peak x matmul efficiency), bytes /
  (HBM bandwidth x HBM efficiency))`` at the chip's dense bfloat16 peak. Elementwise work
  between matrix products is taken as fused (``pax_core.speed.hlo``). On GPUs the attention
  (``pax_core.dot_product_attention``) is one fused kernel, as Pax's GPU backend runs cuDNN's,
  so its scores stay on chip; on TPUs it is XLA's, and they go through memory.
- **Collectives**: the bandwidth-optimal ring costs (an all-gather or reduce-scatter moves
  ``(n - 1) / n`` of the array through each device, an all-reduce twice that), over the
  slowest level a group spans: in a slice, the ICI links of the torus dimensions the group's
  mesh axes take (both directions where the dimension wraps); across slices, each chip's DCN
  bandwidth; on GPUs, each GPU's NVLink and, across nodes, its network bandwidth. A TPU
  all-to-all costs a quarter of an all-gather of the same bytes on a bidirectional ring. Each
  step of a ring adds the link's latency.
- **Overlap**: the collectives inside a loop body (a scanned layer's weight gathers and
  gradient reductions, a microbatch's) overlap with that body's computation, as XLA's
  latency-hiding scheduler arranges; those outside loops run in series with the computation.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import defaultdict
from typing import Any

import numpy as np

from pax_core.backends.attention import SCOPE as ATTENTION
from pax_core.speed.hardware import Target
from pax_core.speed.hlo import Collective, Cost, step_costs

OVERLAP = ("collectives inside a loop body overlap with the body's computation; those outside "
           "loops run in series with it")


# The torus dimensions one mesh axis takes in a slice: (size, wraps) each.
AxisLinks = tuple[tuple[int, bool], ...]


def _assign_axes(ici: list[int], topology: tuple[int, ...], wraps: tuple[bool, ...]
                 ) -> list[AxisLinks]:
    """Give each mesh axis (innermost first) whole torus dimensions whose sizes multiply to
    its size, else a segment of one dimension (without its wraparound)."""
    free = [(size, wrap) for size, wrap in zip(topology, wraps, strict=True) if size > 1]
    links: list[AxisLinks] = [()] * len(ici)
    for axis in reversed(range(len(ici))):
        size = ici[axis]
        if size == 1:
            continue
        chosen = next((combo for count in range(1, len(free) + 1)
                       for combo in itertools.combinations(range(len(free)), count)
                       if math.prod(free[i][0] for i in combo) == size), None)
        if chosen:
            links[axis] = tuple(free[i] for i in chosen)
            free = [d for i, d in enumerate(free) if i not in chosen]
            continue
        links[axis] = ((size, False),)  # a segment: no wraparound
        split = next((i for i, (d, _) in enumerate(free) if d % size == 0), None)
        if split is not None:  # the rest of that dimension stays for other axes
            rest = free[split][0] // size
            free = [d for i, d in enumerate(free) if i != split] + (
                [(rest, False)] if rest > 1 else [])
    return links


@dataclasses.dataclass
class Layout:
    """Where each device of a mesh sits on a target, and what its collectives cost there."""

    target: Target
    mesh_shape: tuple[int, ...]
    ici: tuple[int, ...]
    dcn: tuple[int, ...]

    def __post_init__(self) -> None:
        coords = np.stack(np.unravel_index(np.arange(math.prod(self.mesh_shape)),
                                           self.mesh_shape), axis=1)
        ici = np.asarray(self.ici)
        self._inner = coords % ici  # the position in its slice, per axis
        slice_coords = coords // ici
        slice_index = np.ravel_multi_index(slice_coords.T, self.dcn) if len(self.dcn) else 0
        rank = slice_index * math.prod(self.ici) + np.ravel_multi_index(self._inner.T, self.ici)
        chip = self.target.chip
        if chip.family == "gpu":
            self._domain = rank // chip.nvlink.domain
            self._axes: list[AxisLinks] = []
        else:
            self._domain = np.asarray(slice_index)
            self._axes = _assign_axes(list(self.ici), self.target.slice_shape,
                                      self.target.wraps())

    def _levels(self, group: list[int]) -> tuple[int, int, float, float, bool]:
        """(devices per domain, domains, inner and outer bandwidth in bytes/s, whether the
        inner rings wrap) of a group."""
        chip = self.target.chip
        members = np.asarray(group)
        outer = len(set(np.atleast_1d(self._domain)[members].tolist()))
        inner = max(1, len(group) // outer)
        if chip.family == "gpu":
            return inner, outer, chip.nvlink.gbps * 1e9, chip.network.gbps_per_gpu * 1e9, False
        varying = [a for a in range(len(self.ici))
                   if len(set(self._inner[members, a].tolist())) > 1]
        dims = [d for a in varying for d in self._axes[a]]
        bandwidth = sum(chip.ici.link_gbps * 1e9 * (2 if wrap else 1) for _, wrap in dims)
        wrapped = bool(dims) and all(wrap for _, wrap in dims)
        return inner, outer, bandwidth or chip.ici.link_gbps * 1e9, \
            chip.dcn.gbps_per_chip * 1e9, wrapped

    def _latencies(self) -> tuple[float, float]:
        chip = self.target.chip
        if chip.family == "gpu":
            return chip.nvlink.latency_us * 1e-6, chip.network.latency_us * 1e-6
        return chip.ici.hop_latency_us * 1e-6, chip.dcn.latency_us * 1e-6

    def seconds(self, collective: Collective) -> tuple[float, str]:
        """One execution's time, and the level it is bound by ("ici", "dcn", "nvlink" or
        "network")."""
        gpu = self.target.chip.family == "gpu"
        names = ("nvlink", "network") if gpu else ("ici", "dcn")
        inner_latency, outer_latency = self._latencies()
        size = collective.payload_bytes
        if collective.kind == "collective-permute":
            pairs = collective.pairs or [(0, 0)]
            crossing = any(self._crosses(a, b) for a, b in pairs)
            _, _, inner_bw, outer_bw, _ = self._levels([p for pair in pairs for p in pair])
            if crossing:
                return size / outer_bw + outer_latency, names[1]
            return size / inner_bw + inner_latency, names[0]
        group = collective.groups[0]
        if len(group) <= 1:
            return 0.0, names[0]
        inner, outer, inner_bw, outer_bw, wrapped = self._levels(group)
        factor = 2.0 if collective.kind == "all-reduce" else 1.0
        inner_time = size * (inner - 1) / inner / inner_bw if inner > 1 else 0.0
        if collective.kind == "all-to-all" and not gpu and inner > 1:
            inner_time = max(inner_time, size * inner / 4 / inner_bw)
        outer_share = size if collective.kind == "all-to-all" else size / inner
        outer_time = outer_share * (outer - 1) / outer / outer_bw if outer > 1 else 0.0
        hops = (inner - 1) / (2 if wrapped else 1)
        latency = hops * inner_latency + (outer - 1) * outer_latency
        level = names[1] if outer_time > inner_time else names[0]
        return factor * (inner_time + outer_time + latency), level

    def axes(self, collective: Collective, names: tuple[str, ...]) -> str:
        """The mesh axes a collective's group spans (a permute's pairs), by ``names``."""
        members = [p for pair in collective.pairs for p in pair] or collective.groups[0]
        coords = np.stack(np.unravel_index(np.asarray(members), self.mesh_shape), axis=1)
        varying = [name for axis, name in enumerate(names)
                   if len(set(coords[:, axis].tolist())) > 1]
        return "+".join(varying) or "-"

    def _crosses(self, a: int, b: int) -> bool:
        domains = np.atleast_1d(self._domain)
        return bool(domains[a] != domains[b])


@dataclasses.dataclass
class Prediction:
    target: str
    chips: int
    step_seconds: float
    compute_seconds: float  # the roofline of the computation
    collective_seconds: float  # all collectives, as if nothing overlapped
    exposed_collective_seconds: float  # what the overlap leaves of them
    tokens_per_sec_per_chip: float | None
    mfu: float | None
    bottleneck: str
    hbm_gib: float
    fits: str  # "yes", "no", or "unsure" (see ``_fit``)
    overlap: str
    top_costs: list[dict[str, Any]]

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _fit(state_gib: float, total_gib: float, hbm_gib: float) -> str:
    """Whether a step fits a chip's memory: "no" when its parameters and optimizer state alone
    do not, "yes" when the compiled total does, else "unsure": the CPU compiler's temporaries
    are an upper bound (it keeps float32 copies of bfloat16 values and schedules without the
    accelerators' memory-aware passes)."""
    if state_gib > hbm_gib:
        return "no"
    return "yes" if total_gib <= hbm_gib else "unsure"


def _compute_seconds(cost: Cost, target: Target) -> tuple[float, str]:
    chip = target.chip
    flops_time = cost.flops / (chip.peak_tflops["bf16"] * 1e12 * chip.matmul_efficiency)
    bytes_time = cost.bytes / (chip.hbm_gbps * 1e9 * chip.hbm_efficiency)
    return (flops_time, "matmul") if flops_time >= bytes_time else (bytes_time, "memory")


def predict(hlo_text: str, target: Target, *, mesh_shape: tuple[int, ...],
            ici: tuple[int, ...], dcn: tuple[int, ...], model_flops: float | None,
            axis_names: tuple[str, ...] | None = None,
            tokens: int | None, state_gib: float, total_gib: float, top: int = 8
            ) -> Prediction:
    """The step time of a compiled train step (its per-device HLO) on ``target``; the mesh's
    ``axis_names`` name the axes each collective runs over in the table of costs."""
    names = axis_names or tuple(f"axis {i}" for i in range(len(mesh_shape)))
    layout = Layout(target, mesh_shape, ici, dcn)
    fused = (ATTENTION,) if target.chip.family == "gpu" else ()
    costs = step_costs(hlo_text, math.prod(mesh_shape), fused)
    per_computation: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    by_kind: dict[str, float] = defaultdict(float)
    rows: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for cost in costs:
        if cost.collective is not None:
            seconds, kind = layout.seconds(cost.collective)
            key = (f"{cost.collective.kind} over "
                   f"{layout.axes(cost.collective, names)} ({kind})", cost.label)
            slot = 1
        else:
            seconds, kind = _compute_seconds(cost, target)
            key = (kind, cost.label)
            slot = 0
        seconds *= cost.executions
        entry = per_computation[cost.computation]
        entry[slot] += seconds
        entry[2] = float(cost.in_loop)
        by_kind[kind] += seconds
        rows[key][0] += seconds
        rows[key][1] += cost.executions
    step = exposed = compute = collectives = 0.0
    for busy, talking, in_loop in per_computation.values():
        compute += busy
        collectives += talking
        if in_loop:
            step += max(busy, talking)
            exposed += max(0.0, talking - busy)
        else:
            step += busy + talking
            exposed += talking
    chips = target.chips
    peak = target.chip.peak_tflops["bf16"] * 1e12
    mfu = model_flops / (step * chips * peak) if model_flops and step > 0 else None
    by_level = {k: v for k, v in by_kind.items() if k not in ("matmul", "memory")}
    candidates = {"matmul compute": by_kind.get("matmul", 0.0),
                  "memory bandwidth": by_kind.get("memory", 0.0)}
    if exposed > 0 and collectives > 0:
        for level, seconds in by_level.items():  # the exposed time, shared out by level
            candidates[f"{level} collectives"] = exposed * seconds / collectives
    hbm = target.chip.hbm_gib
    return Prediction(
        target=target.name, chips=chips, step_seconds=step, compute_seconds=compute,
        collective_seconds=collectives, exposed_collective_seconds=exposed,
        tokens_per_sec_per_chip=tokens / step / chips if tokens and step > 0 else None,
        mfu=mfu, bottleneck=max(candidates, key=candidates.get), hbm_gib=hbm,
        fits=_fit(state_gib, total_gib, hbm), overlap=OVERLAP,
        top_costs=[{"what": what, "where": label, "seconds": seconds,
                    "share": seconds / step if step else 0.0, "executions": int(count)}
                   for (what, label), (seconds, count) in
                   sorted(rows.items(), key=lambda kv: -kv[1][0])[:top]])
