"""The hardware catalogue: chips as data files, each number with its source, and target names.

A prediction of step time is only as good as the peak FLOP/s, memory and link speeds it rests on,
and vendors' tables disagree (dense against sparse, GB against GiB, old against new pages). So
each chip is a TOML file under ``data/`` that cites where every number came from, or says
``assumption: ...`` and why; the loader refuses a number without a source. A user corrects or
adds a chip with a file of their own (``$PAX_HARDWARE_PATH`` or ``--hardware FILE``) instead of
editing code, and the same files give MFU its peak (``pax_core.speed.peak``).

Target names follow the clouds' own: ``v5p-256`` counts TensorCores (128 chips, as Google names
v4 and v5p slices), ``v5e-256`` chips, ``h100-64`` GPUs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pax_core.errors import UsageError

_DATA = Path(__file__).parent / "data"
_REQUIRED = object()
_KINDS = {int: "a whole number", float: "a number", str: "a string", list: "a list",
          dict: "a table"}
# The fields each table may hold: a misspelt field is an error, not a silently missing number.
_FIELDS = {
    "": {"name", "family", "target_prefixes", "target_counts", "cores_per_chip", "device_kinds",
         "devices_per_chip", "chips_per_host", "peak_tflops", "hbm_gib", "hbm_gbps",
         "efficiency", "ici", "dcn", "nvlink", "network", "sources"},
    "efficiency": {"matmul", "hbm"},
    "ici": {"dims", "link_gbps", "hop_latency_us", "wraparound", "max_chips", "shapes"},
    "dcn": {"gbps_per_chip", "latency_us"},
    "nvlink": {"domain", "gbps", "latency_us"},
    "network": {"gbps_per_gpu", "latency_us"},
}


@dataclasses.dataclass(frozen=True)
class Ici:
    """A TPU slice's inter-chip links: a 2D or 3D torus (or mesh, where it does not wrap)."""

    dims: int
    link_gbps: float  # one link, one direction, GB/s
    hop_latency_us: float
    wraparound: str  # "full-cube" or "axis-16": which slice axes wrap (Target.wraps)
    max_chips: int
    shapes: dict[int, tuple[int, ...]]  # chips of one slice -> its published topology


@dataclasses.dataclass(frozen=True)
class Dcn:
    """The data-center network between TPU slices."""

    gbps_per_chip: float
    latency_us: float


@dataclasses.dataclass(frozen=True)
class NvLink:
    """One NVLink domain of GPUs (an HGX node): every GPU reaches every other at ``gbps``."""

    domain: int
    gbps: float  # per GPU, one direction, GB/s
    latency_us: float


@dataclasses.dataclass(frozen=True)
class Network:
    """The network (InfiniBand) between NVLink domains."""

    gbps_per_gpu: float
    latency_us: float


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator as a data file describes it; ``sources`` cites every number."""

    name: str
    family: str
    target_prefixes: tuple[str, ...]
    target_counts: str
    cores_per_chip: int
    device_kinds: tuple[str, ...]
    chips_per_host: int
    peak_tflops: dict[str, float]  # dense, per chip, by dtype; "bf16" always there
    hbm_gib: float
    hbm_gbps: float
    matmul_efficiency: float
    hbm_efficiency: float
    ici: Ici | None
    dcn: Dcn | None
    nvlink: NvLink | None
    network: Network | None
    sources: dict[str, str]
    path: str
    devices_per_chip: int = 1  # JAX devices one chip shows (TPU7x: 2)


@dataclasses.dataclass(frozen=True)
class Target:
    """A cluster named on the command line: ``slices`` slices of ``chip`` (GPUs: one group)."""

    name: str
    chip: Chip
    chips: int
    slices: int
    slice_shape: tuple[int, ...] | None

    def wraps(self) -> tuple[bool, ...]:
        """Which axes of the slice have wraparound links: a ring without them is a line, and a
        collective along it takes about twice as long. GPUs have no slice axes: ``()``."""
        if self.slice_shape is None or self.chip.ici is None:
            return ()
        if self.chip.ici.wraparound == "axis-16":
            return tuple(n == 16 for n in self.slice_shape)
        whole_cubes = all(n % 4 == 0 for n in self.slice_shape)
        return (whole_cubes,) * len(self.slice_shape)


class _File:
    """One data file being read: names the file and the field in each error, and records which
    fields hold numbers, so that each can be checked for a source."""

    def __init__(self, path: str, data: dict[str, Any]):
        self.path, self.data, self.numbers = path, data, set()

    def fail(self, key: str, problem: str) -> UsageError:
        return UsageError(f"hardware file {self.path}: {key} {problem}; correct the file")

    def get(self, key: str, kind: type, default: Any = _REQUIRED) -> Any:
        *parents, last = key.split(".")
        table: Any = self.data
        for parent in parents:
            table = table.get(parent) if isinstance(table, dict) else None
        if not isinstance(table, dict) or last not in table:
            if default is _REQUIRED:
                raise self.fail(key, "is missing")
            return default
        value = table[last]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise self.fail(key, f"must be {_KINDS[kind]}, not {value!r}")
        if kind in (int, float):
            if value <= 0:
                raise self.fail(key, f"must be positive, not {value}")
            self.numbers.add(key)
        return value

    def choice(self, key: str, allowed: tuple[str, ...]) -> str:
        value = self.get(key, str)
        if value not in allowed:
            raise self.fail(key, f"is {value!r}; use one of {', '.join(allowed)}")
        return value

    def names(self, key: str) -> tuple[str, ...]:
        values = self.get(key, list)
        if not all(isinstance(v, str) and v for v in values):
            raise self.fail(key, "must be a list of non-empty strings")
        return tuple(v.lower() for v in values)

    def section(self, name: str, family: str, chip_family: str, needed: bool) -> bool:
        """Whether the optional table ``name`` is there; a target needs its family's tables."""
        if name in self.data and family != chip_family:
            raise self.fail(name, f"is only for family {family!r}")
        if name not in self.data and needed and family == chip_family:
            raise self.fail(name, f"is missing (a {family} with target_prefixes needs it)")
        return name in self.data and isinstance(self.get(name, dict), dict)


def _shapes(f: _File, dims: int, max_chips: int) -> dict[int, tuple[int, ...]]:
    shapes = {}
    for key, shape in f.get("ici.shapes", dict).items():
        if not (key.isdigit() and isinstance(shape, list) and len(shape) == dims
                and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
                and math.prod(shape) == int(key) <= max_chips):
            raise f.fail(f"ici.shapes.{key}", f"must be {dims} positive whole numbers whose "
                         f"product is the chip count {key} (at most ici.max_chips)")
        shapes[int(key)] = tuple(shape)
    f.numbers.add("ici.shapes")
    return shapes


def _load(path: str) -> Chip:
    """Reads and checks one data file; every mistake in it is one line naming the field."""
    try:
        with open(path, "rb") as stream:
            data = tomllib.load(stream)
    except OSError as error:
        raise UsageError(f"hardware file {path}: cannot be read ({error.strerror}); "
                         "check the path") from None
    except tomllib.TOMLDecodeError as error:
        raise UsageError(f"hardware file {path}: not valid TOML ({error}); "
                         "correct the file") from None
    f = _File(path, data)
    for table, allowed in _FIELDS.items():
        fields = data.get(table, {}) if table else data
        unknown = sorted(set(fields) - allowed) if isinstance(fields, dict) else []
        if unknown:
            raise f.fail(".".join(p for p in (table, unknown[0]) if p),
                         f"is not a field; the fields are {', '.join(sorted(allowed))}")
    family = f.choice("family", ("tpu", "gpu"))
    prefixes = f.names("target_prefixes")
    peaks = {dtype: f.get(f"peak_tflops.{dtype}", float) for dtype in f.get("peak_tflops", dict)}
    if "bf16" not in peaks:
        raise f.fail("peak_tflops.bf16", "is missing")
    f.get("efficiency", dict)
    efficiency = {k: f.get(f"efficiency.{k}", float) for k in ("matmul", "hbm")}
    for key, value in efficiency.items():
        if value > 1:
            raise f.fail(f"efficiency.{key}", f"is {value}; it is a fraction of peak, at most 1")
    ici = dcn = nvlink = network = None
    if f.section("ici", "tpu", family, bool(prefixes)):
        dims, max_chips = f.get("ici.dims", int), f.get("ici.max_chips", int)
        ici = Ici(dims, f.get("ici.link_gbps", float), f.get("ici.hop_latency_us", float),
                  f.choice("ici.wraparound", ("full-cube", "axis-16")), max_chips,
                  _shapes(f, dims, max_chips))
    if f.section("dcn", "tpu", family, bool(prefixes)):
        dcn = Dcn(f.get("dcn.gbps_per_chip", float), f.get("dcn.latency_us", float))
    if f.section("nvlink", "gpu", family, bool(prefixes)):
        nvlink = NvLink(f.get("nvlink.domain", int), f.get("nvlink.gbps", float),
                        f.get("nvlink.latency_us", float))
    if f.section("network", "gpu", family, bool(prefixes)):
        network = Network(f.get("network.gbps_per_gpu", float), f.get("network.latency_us", float))
    chip = Chip(
        f.get("name", str).lower(), family, prefixes,
        f.choice("target_counts", ("cores", "chips")), f.get("cores_per_chip", int),
        f.names("device_kinds"), f.get("chips_per_host", int), peaks, f.get("hbm_gib", float),
        f.get("hbm_gbps", float), efficiency["matmul"], efficiency["hbm"], ici, dcn, nvlink,
        network, f.get("sources", dict), path, f.get("devices_per_chip", int, 1))
    for key in sorted(f.numbers):
        if not (isinstance(chip.sources.get(key), str) and chip.sources[key].strip()):
            raise f.fail(f'sources."{key}"', "is missing: every number needs its source "
                         "(a citation, or 'assumption: ...' saying why)")
    stale = sorted(set(chip.sources) - f.numbers)
    if stale:
        raise f.fail(f'sources."{stale[0]}"', "names no number of the file")
    return chip


def _files(entry: str) -> list[str]:
    path = Path(entry)
    if path.is_dir():
        return [str(p) for p in sorted(path.glob("*.toml"))]
    if path.is_file():
        return [entry]
    raise UsageError(f"hardware file {entry} does not exist; give a .toml file or a folder of "
                     "them (--hardware, PAX_HARDWARE_PATH)")


@functools.cache
def _builtin() -> dict[str, Chip]:
    return {chip.name: chip for chip in map(_load, _files(str(_DATA)))}


def catalogue(extra: Iterable[str] = ()) -> dict[str, Chip]:
    """Chips by name: the built-in files, then those of ``$PAX_HARDWARE_PATH`` (files or
    folders, ``os.pathsep``-separated), then ``extra``. A later chip of the same name replaces
    an earlier one, so a user corrects a built-in chip by naming it."""
    chips = dict(_builtin())
    entries = [e for e in os.environ.get("PAX_HARDWARE_PATH", "").split(os.pathsep) if e]
    for entry in [*entries, *extra]:
        for path in _files(entry):
            chip = _load(path)
            chips[chip.name] = chip
    return chips


def parse_target(text: str, slices: int = 1, extra: Iterable[str] = (),
                 option: str = "--target") -> Target:
    """The cluster a ``--target`` name (``<prefix>-<count>``) and a slice count describe;
    ``option`` is what the messages call it."""
    by_prefix = {p: chip for chip in catalogue(extra).values() for p in chip.target_prefixes}
    prefix, _, count_text = text.strip().lower().rpartition("-")
    chip = by_prefix.get(prefix)
    where = f"{option} {text!r}"
    if chip is None:
        raise UsageError(f"{where}: unknown chip {prefix or text!r}; write <chip>-<count> with "
                         f"<chip> one of {', '.join(sorted(by_prefix))}")
    if not count_text.isdigit() or int(count_text) < 1:
        raise UsageError(f"{where}: {count_text!r} is not a number of {chip.target_counts}; "
                         f"write e.g. {prefix}-8")
    count = int(count_text)
    if chip.devices_per_chip > 1:
        raise UsageError(f"{where}: a {chip.name} chip is {chip.devices_per_chip} JAX devices, "
                         f"which --target does not place yet; its figures are in {chip.path}")
    if slices < 1:
        raise UsageError(f"{where}: {slices} slices; give 1 or more")
    if chip.family == "gpu":
        assert chip.nvlink is not None  # a GPU with target prefixes has one (_load)
        if slices > 1:
            raise UsageError(f"{where}: {slices} slices, but slices are TPU slices; for more "
                             f"GPUs give more, e.g. {prefix}-{count * slices}")
        domain = chip.nvlink.domain
        if count > domain and count % domain:
            raise UsageError(f"{where}: {count} GPUs do not fill whole {domain}-GPU NVLink "
                             f"domains; use at most {domain} or a multiple of {domain}")
        return Target(text, chip, count, 1, None)
    assert chip.ici is not None  # a TPU with target prefixes has one (_load)
    per_chip = chip.cores_per_chip if chip.target_counts == "cores" else 1
    if count % per_chip:
        raise UsageError(f"{where}: {count} cores is not a whole number of chips "
                         f"({per_chip} cores each); use a multiple of {per_chip}")
    shape = chip.ici.shapes.get(count // per_chip)
    if shape is None:
        valid = ", ".join(str(n * per_chip) for n in sorted(chip.ici.shapes))
        raise UsageError(f"{where}: no published {prefix} slice has {count} "
                         f"{chip.target_counts}; use one of {valid}")
    return Target(text, chip, count // per_chip * slices, slices, shape)


def chip_for_device_kind(device_kind: str) -> Chip | None:
    """The built-in chip whose ``device_kinds`` name ``device_kind`` (jax's), or None.

    The longest name found wins, so "TPU v5 lite" is v5e although it also holds v5p's "tpu v5",
    and a name counts only at the start of a word, so "NVIDIA GB200" is not a B200.
    """
    kind = device_kind.lower()
    found = [(len(name), chip) for chip in _builtin().values() for name in chip.device_kinds
             if re.search(rf"(?<![a-z0-9]){re.escape(name)}", kind)]
    return max(found, key=lambda match: match[0])[1] if found else None
