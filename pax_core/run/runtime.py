"""Starting the runtime: joining the other processes, applying presets, preparing backends,
opening the compilation cache, starting JAX.

Presets and ``prepare`` must run before JAX starts its runtime, which is why this is the first
thing a command does once the configuration is known to be valid.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax

from pax_core.backends.attention import use_backend
from pax_core.backends.base import Backend
from pax_core.backends.presets import Preset, Setting, apply_presets, check_names
from pax_core.errors import UsageError
from pax_core.parallel.layouts import mesh_layout
from pax_core.parallel.processes import DistributedOptions, join_processes
from pax_core.plugins.host import PluginHost
from pax_core.run.compilation_cache import use_compilation_cache

# JAX's platform names that one backend serves.
_PLATFORM_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


@dataclasses.dataclass
class Runtime:
    """The started runtime: its devices, every preset value in force, and where compiled
    programs are cached (``pax_core.run.compilation_cache``)."""

    devices: list[jax.Device]
    settings: list[Setting]
    compilation_cache: str = "off"


def layout_presets(host: PluginHost, experiment: Any, processes: DistributedOptions
                   ) -> tuple[str, list[Preset]]:
    """The experiment's mesh layout's name and its presets for the experiment's slices."""
    name, layout = mesh_layout(host, experiment)
    return name.split("/")[-1], layout.presets(list(experiment.DCN_MESH_SHAPE or [1]), processes)


def platform_name(platform: str | None) -> str | None:
    """The platform asked for (``--platform``, else ``JAX_PLATFORMS``'s first), or None."""
    return platform or (os.environ.get("JAX_PLATFORMS") or "").split(",")[0] or None


def backend_platform(name: str | None) -> str | None:
    """The backend's name for JAX's platform ``name`` (``cuda`` and ``rocm`` are ``gpu``)."""
    return _PLATFORM_ALIASES.get(name, name) if name else None


def preparing(backends: dict[str, Backend], name: str | None) -> dict[str, Backend]:
    """The backends that prepare for a run on platform ``name``: its own, or every one when
    no platform is named (which one JAX picks is known only once it has started)."""
    chosen = backend_platform(name)
    return {n: b for n, b in backends.items() if chosen in (None, n)}


def platform_backends(host: PluginHost, platform: str | None) -> list[Backend]:
    """The registered backends that prepare a process for ``--platform`` (or
    ``JAX_PLATFORMS``), built: every one when no platform is named."""
    backends = {e.name: e.build() for e in host.components("backends")}
    return list(preparing(backends, platform_name(platform)).values())


def accelerator_platform(platform: str | None) -> str | None:
    """The backend's name (``gpu``, ``tpu``, ``cpu``) of ``--platform`` or ``JAX_PLATFORMS``;
    None when neither names one."""
    return backend_platform(platform_name(platform))


# What to install for each accelerator platform JAX can be asked for.
_CUDA = ("install JAX's CUDA build (pip install -U 'jax[cuda12]', with pax-gpu for the GPU "
         "backend's settings)")
_INSTALL = {
    "gpu": _CUDA,
    "cuda": _CUDA,
    "rocm": "install JAX's ROCm build (pip install -U 'jax[rocm]')",
    "tpu": "install JAX's TPU build on a TPU VM (pip install -U 'jax[tpu]')",
}


def _unavailable(name: str | None, platform: str | None, error: RuntimeError) -> str:
    """One line for a platform JAX cannot start: where it was asked for, what JAX has instead,
    and what to do about it."""
    if name is None:  # none was asked for: JAX's own choice failed (a TPU another process holds)
        return (f"JAX could not start the devices here ({str(error).splitlines()[0]}); if "
                f"another process holds the accelerator, end it, or run on the CPU with "
                f"--platform cpu")
    asked = (f"--platform {platform}" if platform
             else f"JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS', '')}")
    remedy = _INSTALL.get(name or "", "")
    try:  # what this process has, unless the platforms JAX was restricted to failed too
        present = sorted({d.platform for d in jax.devices()}) if platform else []
    except RuntimeError:
        present = []
    instead = (f"; or run on {', '.join(present)} here with --platform {present[0]}"
               if present else "; or drop the setting to use what JAX finds")
    return (f"{asked}: no {name} devices here ({str(error).splitlines()[0]})"
            + (f"; {remedy}" if remedy else "") + instead)


def start_runtime(host: PluginHost, platform: str | None, experiment: Any,
                  distributed: DistributedOptions | None = None) -> Runtime:
    """Join the run's other processes, apply presets, start JAX, and check the devices.

    The mesh layout's presets apply first, then each preparing backend's. With a named platform
    (``--platform`` or ``JAX_PLATFORMS``) only its backend prepares; with none, every installed
    backend prepares (each touches only its own platform's settings), since which platform JAX
    will pick is known only once it has started.
    """
    processes = distributed or DistributedOptions.parse()
    join_processes(processes)
    name = platform_name(platform)
    backends = {e.name: e.build() for e in host.components("backends")}
    prepared = preparing(backends, name)
    layout = layout_presets(host, experiment, processes)
    presets = {n: b.presets() for n, b in backends.items()}
    check_names([f"{owner}.{p.name}" for owner, group in [layout, *presets.items()]
                 for p in group])
    settings = apply_presets(*layout)
    by_backend = {}
    for backend_name, backend in prepared.items():
        by_backend[backend_name] = apply_presets(backend_name, presets[backend_name])
        backend.prepare()
    cache = use_compilation_cache()
    try:
        devices = jax.devices(name) if name else jax.devices()
    except RuntimeError as e:
        raise UsageError(_unavailable(name, platform, e)) from e
    detected = backend_platform(devices[0].platform)
    if detected in prepared:
        prepared[detected].check(devices)
        use_backend(prepared[detected])
    # The other platforms' presets touched only their own settings: not worth reporting.
    return Runtime(devices, settings + by_backend.get(detected, []), cache)


def check_program(host: PluginHost, devices: list[jax.Device], program: Any) -> None:
    """The devices' backend's ``check_program`` of a traced program; nothing to check on a
    platform without a registered backend."""
    platform = backend_platform(devices[0].platform)
    backends = {e.name: e for e in host.components("backends")}
    if platform in backends:
        backends[platform].build().check_program(devices, program)


def donates_train_state(host: PluginHost, devices: list[jax.Device]) -> bool:
    """The devices' backend's choice; a platform without a registered backend donates."""
    platform = backend_platform(devices[0].platform)
    backends = {e.name: e for e in host.components("backends")}
    return backends[platform].build().donates_train_state if platform in backends else True
