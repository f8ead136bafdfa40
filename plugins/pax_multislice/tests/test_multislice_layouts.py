"""The multi-slice layout on 8 fake CPU devices in one process: slices, presets, and the
compiled program's collectives (its HLO replica groups) staying inside a slice on ICI axes."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

from pax_core import Component, DistributedOptions, MeshLayout, UsageError, hookimpl
from pax_core.testing import PluginHost, build_run, plan, register_plugin, resolve
from pax_multislice.layouts import MultisliceLayout, megascale_env, slice_groups

SMALL = ["VOCAB_SIZE=256", "MAX_SEQ_LEN=32", "NUM_LAYERS=2", "MODEL_DIMS=64", "HIDDEN_DIMS=128",
         "NUM_HEADS=2", "DIMS_PER_HEAD=32", "PERCORE_BATCH_SIZE=1", "FPROP_DTYPE='float32'"]


def test_one_process_stands_in_consecutive_devices_for_slices():
    grid = MultisliceLayout().device_grid(jax.devices(), [1, 2, 2], [2, 1, 1])
    assert grid.shape == (2, 2, 2)
    assert {d.id for d in grid[0].flat} == {0, 1, 2, 3}
    assert {d.id for d in grid[1].flat} == {4, 5, 6, 7}
    groups, found = slice_groups(jax.devices(), 4)
    assert [len(g) for g in groups] == [2, 2, 2, 2] and found.startswith("consecutive")


def test_a_mesh_that_does_not_match_the_slices_is_one_message():
    with pytest.raises(UsageError, match=r"DCN_MESH_SHAPE \[3, 1, 1\] asks for 3 slices of 2 "
                                         r"devices .* the 8 devices form 1 slice\(s\) of 8 "
                                         r"by process"):
        MultisliceLayout().device_grid(jax.devices(), [1, 2, 1], [3, 1, 1])


def test_megascale_settings_follow_the_process_and_its_slice():
    told = DistributedOptions("10.0.0.2:1234", 4, 3)
    assert megascale_env(2, told) == {
        "MEGASCALE_NUM_SLICES": "2", "MEGASCALE_COORDINATOR_ADDRESS": "10.0.0.2:8080",
        "MEGASCALE_PORT": "8080", "MEGASCALE_SLICE_ID": "1"}
    # Not told how processes join (Cloud TPU's queued resources set the rest themselves).
    assert megascale_env(2, DistributedOptions()) == {"MEGASCALE_NUM_SLICES": "2"}
    names = [p.name for p in MultisliceLayout().presets([2, 1, 1], told)]
    assert names == ["megascale", "dcn-data-parallel", "async-collectives"]
    assert MultisliceLayout().presets([1, 1, 1], told) == []


def _iota(dims: str, perm: str | None) -> np.ndarray:
    """XLA's ``[dims]T(perm)``: an iota of that shape, transposed, flattened."""
    shape = [int(x) for x in dims.split(",")]
    ids = np.arange(np.prod(shape)).reshape(shape)
    return (ids.transpose([int(x) for x in perm.split(",")]) if perm else ids).reshape(-1)


def _groups(line: str) -> np.ndarray | None:
    """The replica groups of one collective, in any of XLA's three spellings: explicit
    ``{{0,1},{2,3}}``, iota ``[G,S]<=[dims]T(perm)``, or over named axes of a mesh
    ``mesh['axis_0'=2,...], device_ids=([dims]T(perm)) {'axis_1'}``."""
    if m := re.search(r"replica_groups=\{(\{[\d,]*\}(?:,\{[\d,]*\})*)\}", line):
        return np.array([[int(x) for x in g.split(",")]
                         for g in re.findall(r"\{([\d,]+)\}", m.group(1))])
    if m := re.search(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line):
        return _iota(m.group(3), m.group(4)).reshape(int(m.group(1)), int(m.group(2)))
    if m := re.search(r"replica_groups=mesh\[([^\]]*)\]", line):
        axes = re.findall(r"'(\w+)'=(\d+)", m.group(1))
        shape = [int(size) for _, size in axes]
        ids = re.search(r"device_ids=\(\[([\d,]+)\](?:T\(([\d,]+)\))?\)", line)
        flat = _iota(*ids.groups()) if ids else np.arange(np.prod(shape))
        over = re.search(r"\) \{([^}]*)\}|\] \{([^}]*)\}", line)
        named = re.findall(r"'(\w+)'", next(g for g in over.groups() if g is not None))
        inside = [i for i, (name, _) in enumerate(axes) if name in named]
        outside = [i for i in range(len(axes)) if i not in inside]
        grid = flat.reshape(shape).transpose(outside + inside)
        return grid.reshape(-1, int(np.prod([shape[i] for i in inside])))
    return None


def _replica_groups(hlo: str) -> list[tuple[str, np.ndarray]]:
    """(op, groups) of every collective of a compiled program."""
    found = []
    for line in hlo.splitlines():
        op = re.search(r"= \S+ (all-gather|all-reduce|reduce-scatter|all-to-all)(-start)?\(",
                       line)
        groups = _groups(line) if op is not None else None
        if groups is not None:
            found.append((op.group(1), groups))
    return found


def _leaks(run, slice_of) -> tuple[list[str], set[int]]:
    """Collectives of the compiled train step with a group that takes part of one slice
    together with other slices (a collective over ICI axes that left its slice), and the
    sizes of all groups."""
    compiled = run.compile_train_step(donate_state=False)
    assignment = list(run.partitioner.mesh.devices.flat)  # HLO device ids index this
    size = len(assignment) // len({slice_of(d) for d in assignment})
    leaks, sizes = [], set()
    for op, groups in _replica_groups(compiled.as_text()):
        for group in groups:
            sizes.add(len(group))
            slices = [slice_of(assignment[i]) for i in group]
            touched = {s: slices.count(s) for s in slices}
            if len(touched) > 1 and any(n not in (1, size) for n in touched.values()):
                leaks.append(f"{op} {list(group)}")
    return leaks, sizes


class Interleaved(MeshLayout):
    """A wrong layout: the slices' devices alternate, so ICI axes straddle slices."""

    def device_grid(self, devices, ici, dcn):
        half = len(devices) // 2
        mixed = [d for pair in zip(devices[:half], devices[half:], strict=True) for d in pair]
        return super().device_grid(mixed, ici, dcn)


class InterleavedPlugin:
    @hookimpl
    def pax_register_mesh_layouts(self):
        return [Component("interleaved", f"{__name__}:Interleaved", "a wrong layout")]


def _run(exp: str, *extra: str, host: PluginHost | None = None):
    host = host or PluginHost()
    return build_run(host, resolve(host, exp, "lm", [*SMALL, *extra]), jax.devices(),
                     read_data=False)


@pytest.mark.parametrize("exp", ["LmCloudSpmdMultislice2B", "C4Spmd22BAdam2xv4_8"])
def test_collectives_over_ici_axes_stay_inside_a_slice(exp):
    run = _run(exp)
    assert run.mesh_layout == "multislice"
    assert dict(run.partitioner.mesh.shape) == {"replica": 2, "data": 4, "mdl": 1}
    slice_of = lambda d: d.id // 4  # noqa: E731  one process: consecutive devices are a slice
    leaks, sizes = _leaks(run, slice_of)
    assert {2, 4} <= sizes  # the gradient all-reduce over DCN, the FSDP gathers over ICI
    assert leaks == []
    host = PluginHost()
    with register_plugin(host, InterleavedPlugin()):
        wrong = _run(exp, "MESH_LAYOUT='interleaved'", host=host)
    assert _leaks(wrong, slice_of)[0], "the check cannot see a layout that mixes slices"


def test_pax_plan_shows_what_the_layout_would_set():
    host = PluginHost()
    report = plan(host, exp="LmCloudSpmdMultislice2B", plugin="lm", set_items=SMALL)
    assert report.mesh == {"replica": 2, "data": 4, "mdl": 1}
    assert "multislice.megascale: MEGASCALE_NUM_SLICES=2" in report.presets
    assert any(p.startswith("multislice.async-collectives: LIBTPU_INIT_ARGS")
               for p in report.presets)
