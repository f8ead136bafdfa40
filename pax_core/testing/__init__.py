"""What a plugin author needs to test a plugin, also loaded as a pytest plugin.

* ``PluginConformance`` — the conformance suite: subclass it in the plugin's tests
  (``class TestConformance(PluginConformance): plugin = "myplugin"``), see
  ``pax_core.testing.conformance``.
* ``use_cpu_devices(8)`` — call at the top of ``conftest.py``, before JAX is imported, to get 8
  fake CPU devices; ``cpu_xla_flags(n)`` is the ``XLA_FLAGS`` value for a process a test starts
  with ``n`` of them (both compile without LLVM's optimisations: ``pax_core.testing.cpu``).
* ``isolated_host(*plugins)`` — a plugin host with the built-ins and only the given plugins (no
  installed entry points), so a test sees exactly what it registered.
* the ``pax_host`` fixture (an isolated host) and ``register_plugin(host, obj)`` for a throwaway
  plugin that lives for one test.
* ``cpu_mesh(shape, axis_names)`` — a ``jax.sharding.Mesh`` over the fake devices.
* ``splash_served()`` — in a ``with`` block, ``pax_core.dot_product_attention`` is served as
  on a TPU: by the tpu backend, its Splash kernel run by Pallas' interpreter on the CPU.
* ``run_pax(*args)`` — the installed ``pax`` command as a user runs it, plugin failures fatal;
  ``read_metrics(job_dir)`` — the records of its ``metrics.jsonl``.
* Fault trials (``pax_core.testing.faults``): ``kill_trials(args, job_dir, trials=N)`` runs
  ``pax train`` until SIGKILL has killed N runs mid-run, each at a random moment, then to the
  end; ``read_params(job_dir)``, ``train_losses(job_dir)`` and ``assert_same_params`` compare the
  result bitwise with a run left alone; ``kill_and_compare`` does all of it on 1 and 8 devices;
  ``stop_once_saved(command, job_dir, signum)`` signals a command once a checkpoint is saved;
  ``fault_trials(ci, soak)`` is how many trials to run: a fixed sample in an ordinary test run,
  the full count when ``PAX_SOAK=1`` asks for a soak.
* A test run's processes (xdist workers and the ``pax`` commands tests start) share one cache
  folder made for that run (``PAX_CACHE_DIR``, unless set): compiled programs are compiled once
  per run, and no result depends on what an earlier run left.
* What a command does, in the test's own process: ``resolve`` (experiment + ``--set`` items to
  a config), ``build_run`` (a resolved experiment placed on devices, nothing allocated),
  ``train`` and ``evaluate`` (``pax train`` / ``pax eval``), ``plan`` (``pax plan``, after
  ``use_fake_devices(n)`` in a fresh process), ``step_flops`` (model and hardware FLOPs of a
  compiled step), ``first_batch_losses`` (the loss of a few training steps on one batch: does a
  configuration learn? ``going_down`` says whether they fall).

Importing this module does not import JAX.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from pax_core.files import CACHE_DIR_VAR
from pax_core.plugins.host import PluginHost, PluginSelection
from pax_core.testing.commands import read_metrics, run_pax
from pax_core.testing.conformance import PluginConformance, going_down, parametrize_conformance
from pax_core.testing.cpu import cpu_xla_flags, use_cpu_devices
from pax_core.testing.faults import (
    KillTrials,
    assert_same_params,
    fault_trials,
    kill_and_compare,
    kill_trials,
    read_params,
    stop_once_saved,
    train_losses,
)

# Names this module lends from the core, imported on first use (they import JAX).
_LENT = {
    "resolve": "pax_core.config.resolve",
    "build_run": "pax_core.run.build",
    "train": "pax_core.commands.jobs",
    "evaluate": "pax_core.commands.jobs",
    "import_job": "pax_core.commands.import_weights",
    "export_params": "pax_core.commands.export",
    "plan": "pax_core.commands.plan",
    "use_fake_devices": "pax_core.commands.plan",
    "step_flops": "pax_core.speed.flops",
    "first_batch_losses": "pax_core.testing.training",
    "first_batch_steps": "pax_core.testing.training",
}

__all__ = [  # noqa: RUF022 (the lent names last)
    "KillTrials", "PluginConformance", "PluginHost", "assert_same_params", "cpu_mesh",
    "cpu_xla_flags",
    "fault_trials", "going_down", "isolated_host", "kill_and_compare", "kill_trials", "pax_host",
    "read_metrics",
    "read_params", "register_plugin", "run_pax", "splash_served", "stop_once_saved",
    "train_losses",
    "use_cpu_devices",
    "build_run", "evaluate", "export_params", "first_batch_losses", "first_batch_steps",
    "import_job", "plan",
    "resolve", "step_flops", "train",
    "use_fake_devices",
]


def __getattr__(name: str) -> Any:
    if name not in _LENT:
        raise AttributeError(f"module 'pax_core.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(_LENT[name]), name)


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


@contextlib.contextmanager
def splash_served() -> Iterator[None]:
    """Attention served as on a TPU for the duration of a ``with`` block: the tpu backend,
    Splash in Pallas' interpreter (so that a layer's use of the kernel is testable here)."""
    import functools

    from pax_core.backends import attention, splash
    from pax_core.backends.tpu import TpuBackend

    running, takes_all, kernel = attention._running, attention._takes_all, splash.splash_attention
    splash.splash_attention = functools.partial(kernel, interpret=True)
    attention.use_backend(TpuBackend())
    try:
        yield
    finally:
        attention._running, attention._takes_all = running, takes_all
        splash.splash_attention = kernel


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


def pytest_configure(config: pytest.Config) -> None:
    """Give the test run a cache folder of its own, made by the process that starts the run and
    inherited by its xdist workers and by every ``pax`` command a test starts: a program one
    process compiled is read from disk by the others, and nothing an earlier run left is read.
    A ``PAX_CACHE_DIR`` already set (a worker's, or the user's) is kept."""
    if os.environ.get(CACHE_DIR_VAR):
        return
    folder = tempfile.mkdtemp(prefix="pax-test-run-")
    os.environ[CACHE_DIR_VAR] = folder

    def remove() -> None:
        os.environ.pop(CACHE_DIR_VAR, None)
        shutil.rmtree(folder, ignore_errors=True)

    config.add_cleanup(remove)


@pytest.fixture
def pax_host() -> PluginHost:
    """An isolated plugin host: the built-ins and nothing installed."""
    return isolated_host()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize the conformance suite's tests by the plugin's registrations."""
    parametrize_conformance(metafunc)
