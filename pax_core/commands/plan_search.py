"""``pax plan --search``: the meshes that fill a target, ranked by predicted step time.

Every way of splitting one slice's chips over the experiment's mesh axes (and, with ``--vary``,
every value of the constants named) is compiled on fake devices as ``pax plan --target`` does;
a candidate the experiment refuses (a batch its axes do not divide, experts an axis cannot
split) is dropped with its reason, and the rest are
ranked by predicted step time (the global batch is the same for each), those within 1% of each
other by the memory they need. A candidate whose parameters and optimizer state alone overflow the
chip's memory is dropped; one that fits only by the compiled temporaries (an upper bound
compiled for the CPU) is kept and marked. The DCN part of the mesh is the experiment's (on
GPUs, where it spans nodes, when it divides the GPUs), or else all on the first axis (data
parallelism across slices, Pax's multi-slice convention).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import Counter
from typing import Any

from pax_core.commands import plan as planning
from pax_core.config.resolve import experiment_class
from pax_core.errors import UsageError
from pax_core.plugins.host import PluginHost
from pax_core.speed.hardware import Target
from pax_core.speed.predict import Prediction

SHOWN = 5
TIE = 0.01


@dataclasses.dataclass
class Candidate:
    set_items: list[str]
    mesh_text: str
    varied: str
    prediction: Prediction
    total_gib: float
    command: str

    def as_json(self) -> dict[str, Any]:
        return {"set": self.set_items, "mesh": self.mesh_text, "varied": self.varied,
                "total_gib": self.total_gib, "command": self.command,
                "prediction": self.prediction.as_json()}


@dataclasses.dataclass
class SearchResult:
    experiment: str
    target: str
    tried: int
    ranked: list[Candidate]
    dropped: dict[str, int]
    show: int = SHOWN

    def as_json(self) -> dict[str, Any]:
        return {"experiment": self.experiment, "target": self.target, "tried": self.tried,
                "ranked": [c.as_json() for c in self.ranked], "dropped": self.dropped}


def _splits(total: int, axes: int) -> list[tuple[int, ...]]:
    """Every ordered way of writing ``total`` as a product of ``axes`` factors."""
    if axes == 1:
        return [(total,)]
    return [(d, *rest) for d in range(1, total + 1) if total % d == 0
            for rest in _splits(total // d, axes - 1)]


def parse_vary(items: list[str]) -> list[tuple[str, list[str]]]:
    """``NAME=A,B`` items: a constant and the values to try."""
    parsed = []
    for item in items:
        name, sep, values = item.partition("=")
        if not sep or not name.strip() or not values.strip():
            raise UsageError(f"--vary {item!r}: expected NAME=VALUE,VALUE (e.g. "
                             f"CHECKPOINT_POLICY=SAVE_NOTHING,SAVE_DOT_ONLY)")
        parsed.append((name.strip(), [v.strip() for v in values.split(",") if v.strip()]))
    return parsed


def _shape(values: Any) -> str:
    return "[" + ",".join(str(v) for v in values) + "]"


@dataclasses.dataclass(frozen=True)
class Choice:
    """One candidate to plan: the ``--set`` items it adds, and how the tables name it."""

    set_items: list[str]
    mesh_text: str
    varied: str


def choices(host: PluginHost, *, exp: str, plugin: str | None, set_items: list[str],
            target: Target, vary: list[str] | None = None, limit: int = 64) -> list[Choice]:
    """The candidates for ``target``, checked before JAX starts: a mesh to search, valid
    ``--vary`` items, and no more candidates than ``limit``."""
    _, cls = experiment_class(host, exp, plugin, set_items)
    names = list(getattr(cls, "MESH_AXIS_NAMES", None) or ())
    if not names or not cls.ICI_MESH_SHAPE:
        raise UsageError(f"{cls.__name__} declares no mesh (ICI_MESH_SHAPE and "
                         f"MESH_AXIS_NAMES), so there is no mesh to search")
    dcn = list(cls.DCN_MESH_SHAPE or [1] * len(names))
    keeps = (math.prod(dcn) == target.slices if target.chip.family == "tpu"
             else target.chips % math.prod(dcn) == 0)
    if not keeps:
        dcn = [target.slices] + [1] * (len(names) - 1)
    per_slice = target.chips // math.prod(dcn)
    varied = parse_vary(vary or [])
    declared = tuple(cls.ICI_MESH_SHAPE) if math.prod(cls.ICI_MESH_SHAPE) == per_slice else None
    meshes = _splits(per_slice, len(names))
    meshes.sort(key=lambda m: (m != declared, sum(1 for v in m if v > 1)))
    combos = list(itertools.product(meshes, *[values for _, values in varied]))
    if len(combos) > limit:
        raise UsageError(f"{len(combos)} candidates for {target.name} (meshes x --vary values) "
                         f"and --search-limit is {limit}; raise it (each candidate compiles "
                         f"once) or vary fewer constants")
    found = []
    for mesh, *values in combos:
        extra = [f"ICI_MESH_SHAPE={_shape(mesh)}"]
        if math.prod(dcn) > 1 or cls.DCN_MESH_SHAPE:
            extra.append(f"DCN_MESH_SHAPE={_shape(dcn)}")
        extra += [f"{name}={value}" for (name, _), value in zip(varied, values, strict=True)]
        words = " ".join(f"{n} {v}" for n, v in zip(names, mesh, strict=True) if v > 1)
        found.append(Choice(extra, words or "one device", ", ".join(
            f"{n}={v}" for (n, _), v in zip(varied, values, strict=True))))
    return found


def search(host: PluginHost, *, exp: str, plugin: str | None, set_items: list[str],
           target: Target, candidates: list[Choice], hbm_gib: float | None = None
           ) -> SearchResult:
    """Plan every candidate on ``target`` (JAX must already have its chips as fake devices)."""
    ranked: list[Candidate] = []
    dropped: Counter[str] = Counter()
    for choice in candidates:
        try:
            result = planning.plan(host, exp=exp, plugin=plugin,
                                   set_items=set_items + choice.set_items, hbm_gib=hbm_gib,
                                   target=target)
        except UsageError as refused:
            dropped[f"refused by the experiment: {str(refused).split(';')[0][:90]}"] += 1
            continue
        if result.prediction.fits == "no":
            dropped[f"parameters and optimizer state over {result.hbm_gib:g} GiB per chip"] += 1
            continue
        replaced = {item.split("=")[0] for item in choice.set_items}
        kept = [item for item in set_items if item.split("=")[0] not in replaced]
        command = " ".join(["pax train", f"--exp {exp}", *([f"--plugin {plugin}"] if plugin
                                                           else []),
                            *(f"--set {item}" for item in kept + choice.set_items)])
        ranked.append(Candidate(choice.set_items, choice.mesh_text, choice.varied,
                                result.prediction, result.total_gib, command))
    return SearchResult(exp, target.name, len(candidates), rank(ranked), dict(dropped))


def rank(candidates: list[Candidate]) -> list[Candidate]:
    """Fastest first; candidates within ``TIE`` of a faster one's step time are as fast as it
    (the model is not that exact), and among those the one needing less memory goes first."""
    ordered = sorted(candidates, key=lambda c: c.prediction.step_seconds)
    ranked: list[Candidate] = []
    while ordered:
        limit = ordered[0].prediction.step_seconds * (1 + TIE)
        tied = [c for c in ordered if c.prediction.step_seconds <= limit]
        ranked += sorted(tied, key=lambda c: c.total_gib)
        ordered = ordered[len(tied):]
    return ranked
