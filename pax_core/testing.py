"""What a plugin author needs to test a plugin, also loaded as a pytest plugin.

* ``use_cpu_devices(8)`` — call at the top of ``conftest.py``, before JAX is imported, to get 8
  fake CPU devices.
* ``isolated_host(*plugins)`` — a plugin host with the built-ins and only the given plugins (no
  installed entry points), so a test sees exactly what it registered.
* the ``pax_host`` fixture (an isolated host) and ``register_plugin(host, obj)`` for a throwaway
  plugin that lives for one test.
* ``cpu_mesh(shape, axis_names)`` — a ``jax.sharding.Mesh`` over the fake devices.

Importing this module does not import JAX.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from pax_core.plugins import PluginHost, PluginSelection


def use_cpu_devices(count: int = 8) -> None:
    """Make JAX's CPU platform show ``count`` devices; must run before JAX starts."""
    flag = f"--xla_force_host_platform_device_count={count}"
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    os.environ["XLA_FLAGS"] = " ".join([*flags, flag])
    os.environ.setdefault("JAX_PLATFORMS", "cpu")


def isolated_host(*plugins: tuple[str, Any], strict: bool = False) -> PluginHost:
    """A host with the built-ins and the given ``(name, plugin)`` pairs only."""
    host = PluginHost(PluginSelection(strict=strict), entry_points=[])
    for name, plugin in plugins:
        host.register(plugin, name)
    return host


@contextlib.contextmanager
def register_plugin(host: PluginHost, plugin: Any, name: str = "throwaway") -> Iterator[Any]:
    """Register ``plugin`` on ``host`` for the duration of a ``with`` block."""
    record = host.register(plugin, name)
    if record.status != "active":
        host.records.pop(name, None)
        raise AssertionError(f"plugin {name} did not register: {record.reason}")
    try:
        yield record
    finally:
        host.unregister(name)


def cpu_mesh(shape: Sequence[int], axis_names: Sequence[str]):
    """A mesh of the first ``prod(shape)`` devices.

    Built with ``jax.sharding.Mesh``, whose axes are of the Auto type that Flax's logical
    partitioning needs (``jax.make_mesh`` makes Explicit axes by default).
    """
    import jax
    import numpy as np
    from jax.sharding import Mesh

    size = int(np.prod(shape))
    devices = jax.devices()
    if len(devices) < size:
        raise RuntimeError(f"need {size} devices, JAX has {len(devices)}; call "
                           f"use_cpu_devices({size}) before JAX is imported")
    return Mesh(np.asarray(devices[:size]).reshape(shape), tuple(axis_names))


@pytest.fixture
def pax_host() -> PluginHost:
    """An isolated plugin host: the built-ins and nothing installed."""
    return isolated_host()
