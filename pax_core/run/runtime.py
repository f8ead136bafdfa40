"""Starting the runtime: joining the other processes, preparing backends, starting JAX.

The backends' ``prepare`` must run before JAX starts its runtime, which is why this is the first
thing a command does once the configuration is known to be valid.
"""

from __future__ import annotations

import os

import jax

from pax_core.errors import UsageError
from pax_core.parallel.processes import DistributedOptions, join_processes
from pax_core.plugins.host import PluginHost

# JAX's platform names that one backend serves.
_PLATFORM_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def start_runtime(host: PluginHost, platform: str | None,
                  distributed: DistributedOptions | None = None) -> list[jax.Device]:
    """Join the run's other processes, prepare the runtime, start JAX, and check the devices.

    With a named platform (``--platform`` or ``JAX_PLATFORMS``) only its backend prepares; with
    none, every installed backend prepares (each touches only its own platform's settings),
    since which platform JAX will pick is known only once it has started.
    """
    join_processes(distributed)
    name = platform or (os.environ.get("JAX_PLATFORMS") or "").split(",")[0] or None
    backends = {e.name: e for e in host.components("backends")}
    chosen = _PLATFORM_ALIASES.get(name, name) if name else None
    prepared = {n: e.build() for n, e in backends.items() if chosen in (None, n)}
    for backend in prepared.values():
        backend.prepare()
    try:
        devices = jax.devices(name) if name else jax.devices()
    except RuntimeError as e:
        raise UsageError(f"platform '{name}' is not available here: "
                         f"{str(e).splitlines()[0]}") from e
    detected = _PLATFORM_ALIASES.get(devices[0].platform, devices[0].platform)
    if detected in prepared:
        prepared[detected].check(devices)
    return devices


def donates_train_state(host: PluginHost, devices: list[jax.Device]) -> bool:
    """The devices' backend's choice; a platform without a registered backend donates."""
    platform = _PLATFORM_ALIASES.get(devices[0].platform, devices[0].platform)
    backends = {e.name: e for e in host.components("backends")}
    return backends[platform].build().donates_train_state if platform in backends else True
