"""``pax plan``: what a full-size experiment needs, found by compiling it on fake devices.

The experiment is built on as many fake CPU devices as its mesh declares, with abstract shapes
only (no parameter is allocated and no data is read); its train step is lowered and compiled by
XLA's SPMD partitioner exactly as for a real run, but with no optimisation of the machine code
(``ANALYSIS_ONLY``): the program is never run, and its FLOPs and buffers are fixed before code
generation, so the plan is the same a third sooner. The report puts the model's own analytic
FLOPs next to the compiled program's (``pax_core.speed.flops``), and the per-device memory of
parameters, optimizer state and temporaries (from the compiled program) next to a device's
memory.

With a ``--target`` (``v5p-256``, ``h100-64``; ``pax_core.speed.hardware``), the compiled
program is also read for its costs on that hardware (``pax_core.speed.predict``): the predicted
step time, tokens per second per chip, MFU, what bounds the step and its largest costs.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any

import jax

from pax_core.backends.presets import apply_presets
from pax_core.config.resolve import experiment_class, resolve
from pax_core.errors import UsageError
from pax_core.parallel.processes import DistributedOptions
from pax_core.plugins.host import PluginHost
from pax_core.run.build import build_run
from pax_core.run.runtime import layout_presets
from pax_core.run.state import count_params
from pax_core.speed import flops
from pax_core.speed.hardware import Target
from pax_core.speed.predict import Prediction, predict

GIB = 1024**3
# XLA's options for a program that is analysed, never run: LLVM's optimisation of the CPU's
# machine code is a third of the compile time and changes no HLO cost or buffer assignment.
ANALYSIS_ONLY = {"xla_backend_optimization_level": 0}


@dataclasses.dataclass
class Plan:
    experiment: str
    devices: int
    mesh: dict[str, int]
    params: int
    active_params: int
    tokens_per_step: int | None
    model_flops_per_token: float | None
    model_flops_per_step: float | None
    flops_formula: str | None
    hardware_flops_per_step: float | None
    params_gib: float
    opt_state_gib: float
    temporaries_gib: float
    total_gib: float
    hbm_gib: float
    placement: dict[str, Any] = dataclasses.field(default_factory=dict)
    presets: list[str] = dataclasses.field(default_factory=list)
    prediction: Prediction | None = None

    @property
    def fits(self) -> bool:
        return self.total_gib <= self.hbm_gib

    def as_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fits": self.fits}


def check_sizes(devices: int, hbm_gib: float) -> None:
    """Refuse sizes no machine has (before JAX starts: 0 fake devices make JAX fail to start
    with an error about process indices, and a memory of 0 or less makes nothing fit)."""
    if devices < 1:
        raise UsageError(f"--devices must be 1 or more, got {devices}")
    _check_hbm(hbm_gib)


def _check_hbm(hbm_gib: float) -> None:
    if not (math.isfinite(hbm_gib) and hbm_gib > 0):
        raise UsageError(f"--hbm-gib must be a finite number above 0, got {hbm_gib}")


def devices_needed(host: PluginHost, exp: str, plugin: str | None, set_items: list[str],
                   default: int, target: Target | None = None) -> int:
    """The size of the experiment's declared mesh (``default`` when it declares none: Pax's
    data-parallel path uses every device), read from its constants before JAX starts; with a
    ``target``, the mesh must fill its chips and its DCN part span its slices."""
    _, cls = experiment_class(host, exp, plugin, set_items)
    size = cls.mesh_size()
    if target is None:
        return size or default
    check_fits_target(cls, target)
    return size or target.chips


def check_fits_target(cls: type, target: Target) -> None:
    """One line for a mesh the target cannot hold: another device count, or a DCN part that
    does not match its slices."""
    size = cls.mesh_size()
    ici, dcn = cls.ICI_MESH_SHAPE, cls.DCN_MESH_SHAPE or [1] * len(cls.ICI_MESH_SHAPE or [])
    where = f"ICI_MESH_SHAPE {list(ici)} x DCN_MESH_SHAPE {list(dcn)}" if ici else "no mesh"
    if size and size != target.chips:
        raise UsageError(
            f"{cls.__name__}'s mesh ({where}) has {size} devices and {target.name}"
            f"{f' x {target.slices} slices' if target.slices > 1 else ''} has {target.chips} "
            f"chips; choose a target of {size} chips or --set ICI_MESH_SHAPE / DCN_MESH_SHAPE "
            f"to fill {target.chips}")
    if target.slices > 1 and not ici:
        raise UsageError(f"{target.name} x {target.slices} slices needs a mesh whose "
                         f"DCN_MESH_SHAPE spans them and {cls.__name__} declares none; --set "
                         f"ICI_MESH_SHAPE=... and DCN_MESH_SHAPE=...")
    if target.slices > 1 and math.prod(dcn) != target.slices:
        raise UsageError(
            f"{target.name} x {target.slices} slices needs a DCN_MESH_SHAPE over "
            f"{target.slices} slices and {cls.__name__} has {list(dcn)}; --set DCN_MESH_SHAPE=...")


def use_fake_devices(count: int) -> None:
    """Give JAX ``count`` CPU devices; only possible before its backend has started."""
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", count)


def _gib_per_device(abstract: Any) -> float:
    total = 0
    for leaf in jax.tree.leaves(abstract):
        shard = leaf.sharding.shard_shape(leaf.shape)
        total += math.prod(shard) * leaf.dtype.itemsize
    return total / GIB


def plan(host: PluginHost, *, exp: str, plugin: str | None, set_items: list[str],
         hbm_gib: float | None = None, target: Target | None = None) -> Plan:
    """Build and compile ``exp`` over the devices its mesh declares (all devices when it
    declares none) and report its needs; with a ``target``, predict its step there. The
    memory to fit is ``hbm_gib``, else the target chip's, else 32 GiB."""
    hbm_gib = hbm_gib if hbm_gib is not None else target.chip.hbm_gib if target else 32.0
    _check_hbm(hbm_gib)
    devices = jax.devices()
    num_devices = devices_needed(host, exp, plugin, set_items, len(devices), target)
    if len(devices) < num_devices:
        raise UsageError(f"planning needs {num_devices} devices and JAX has {len(devices)}; "
                         f"run pax plan in a fresh process")
    resolved = resolve(host, exp, plugin, set_items)
    run = build_run(host, resolved, devices[:num_devices], read_data=False)
    # Donated as on the accelerators being planned for, whatever the fake devices are.
    compiled = run.compile_train_step(donate_state=True, compiler_options=ANALYSIS_ONLY)
    memory = compiled.memory_analysis()
    params_gib = _gib_per_device(run.abstract_state.params)
    opt_gib = _gib_per_device(run.abstract_state.opt_state)
    temp_gib = memory.temp_size_in_bytes / GIB if memory is not None else 0.0
    ids = run.batch_spec.get("ids")
    tokens = math.prod(ids.shape) if ids is not None else None
    counted = flops.step_flops(run.task.model, run.batch_spec, compiled, num_devices)
    params = count_params(run.abstract_state.params)
    total_gib = params_gib + opt_gib + temp_gib
    mesh = run.partitioner.mesh
    prediction = None
    if target is not None:
        ici, dcn = _mesh_parts(resolved.experiment, dict(mesh.shape))
        prediction = predict(compiled.as_text(), target, mesh_shape=tuple(mesh.devices.shape),
                             ici=ici, dcn=dcn, axis_names=tuple(mesh.axis_names),
                             model_flops=counted.model, tokens=tokens,
                             state_gib=params_gib + opt_gib, total_gib=total_gib)
    return Plan(
        experiment=resolved.name,
        devices=num_devices,
        mesh=dict(run.partitioner.mesh.shape),
        params=params,
        active_params=active_params(run.task.model, params),
        tokens_per_step=tokens,
        model_flops_per_token=counted.model / tokens if counted.model and tokens else None,
        model_flops_per_step=counted.model,
        flops_formula=counted.formula,
        hardware_flops_per_step=counted.hardware,
        params_gib=params_gib,
        opt_state_gib=opt_gib,
        temporaries_gib=temp_gib,
        total_gib=total_gib,
        hbm_gib=hbm_gib,
        placement=run.partitioner.describe(run.train_input.batch_size),
        presets=_layout_presets(host, resolved.experiment),
        prediction=prediction,
    )


def _mesh_parts(experiment: Any, shape: dict[str, int]) -> tuple[tuple[int, ...], ...]:
    """The ICI and DCN parts of each mesh axis (a mesh not declared is all one slice)."""
    ici = getattr(experiment, "ICI_MESH_SHAPE", None)
    if not ici or len(ici) != len(shape):
        return tuple(shape.values()), (1,) * len(shape)
    dcn = experiment.DCN_MESH_SHAPE or [1] * len(ici)
    return tuple(ici), tuple(dcn)


def active_params(model: Any, params: int) -> int:
    """The weights one example's tokens each multiply: the model's ``active_params()`` (a
    sparse model's; ``pax_core.models.output``), else all ``params`` of them."""
    count = getattr(model, "active_params", None)
    return int(count()) if callable(count) else params


def _layout_presets(host: PluginHost, experiment: Any) -> list[str]:
    """What the experiment's mesh layout would set when the run starts (the backend's presets
    depend on the machine, so a run prints them when it starts)."""
    owner, presets = layout_presets(host, experiment, DistributedOptions.parse())
    return [s.as_text() for s in apply_presets(owner, presets, dict(os.environ))]
