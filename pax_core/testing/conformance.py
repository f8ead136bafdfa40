"""The conformance suite: what every plugin must do, checked in the plugin's own tests.

A plugin's tests subclass ``PluginConformance`` and name the plugin (its entry-point name)::

    from pax_core.testing import PluginConformance

    class TestConformance(PluginConformance):
        plugin = "myplugin"

and pytest (with ``pax_core.testing`` loaded as a plugin, which installing pax-core does) runs,
against the installed plugin as ``pax`` would load it:

* the plugin is active, and declares the API range it was built for;
* every registration imports, and those the core builds without arguments (partitioners,
  backends), with a job directory (loggers) or a directory and settings (checkpointers) build;
  every command is a typer app or a function;
* every experiment (``experiments``: all, or the names given) resolves and its config builds;
* its model returns a ``ModelOutput`` with a scalar loss on a batch of its training input's
  shapes (``jax.eval_shape``, so full-size models cost nothing);
* every dataset's position saves as JSON and restores to the same next batch;
* ``pax plan`` compiles each of ``plan_experiments`` (default: the same experiments) on fake
  devices of its mesh, in a subprocess as a user runs it.

Experiments that need a plugin which is not installed are skipped, and so are input checks whose
data is not on this machine, each with the reason.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Sequence
from typing import Any

import pytest

from pax_core.checkpointers.base import CheckpointSettings
from pax_core.errors import UsageError
from pax_core.plugins.host import PluginHost


@functools.cache
def _host() -> PluginHost:
    """The installed plugins, as ``pax`` loads them; loaded once (collection asks for it for
    every parametrized test)."""
    return PluginHost()


def _experiments(plugin: str, names: Sequence[str] | None) -> list[str]:
    entries = [e.name for e in _host().components("experiments") if e.plugin == plugin]
    return list(names) if names is not None else entries


def parametrize_conformance(metafunc: pytest.Metafunc) -> None:
    """``pytest_generate_tests`` for subclasses of ``PluginConformance``."""
    cls = metafunc.cls
    if cls is None or not issubclass(cls, PluginConformance) or not cls.plugin:
        return
    if "registration" in metafunc.fixturenames:
        record = _host().records.get(cls.plugin)
        registered = record.registered if record is not None else {}
        cases = [(kind, name) for kind, names in registered.items() for name in names]
        metafunc.parametrize("registration", cases, ids=[f"{k}/{n}" for k, n in cases])
    if "experiment" in metafunc.fixturenames:
        names = _experiments(cls.plugin, cls.experiments)
        metafunc.parametrize("experiment", names)
    if "planned_experiment" in metafunc.fixturenames:
        names = _experiments(cls.plugin, cls.plan_experiments if cls.plan_experiments is not None
                             else cls.experiments)
        metafunc.parametrize("planned_experiment", names)


def _resolve(host: PluginHost, plugin: str, experiment: str):
    from pax_core.config.resolve import resolve

    try:
        return resolve(host, experiment, plugin, [])
    except UsageError as e:
        if "plugin, which is not installed" in str(e):
            pytest.skip(str(e))
        raise


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import numpy as np

    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


class PluginConformance:
    """Subclass in a plugin's tests and set ``plugin``; see the module's documentation."""

    plugin: str = ""
    experiments: Sequence[str] | None = None
    plan_experiments: Sequence[str] | None = None

    @pytest.fixture(scope="class")
    @classmethod
    def host(cls) -> PluginHost:
        return _host()

    def test_plugin_is_active_and_declares_its_api(self, host: PluginHost) -> None:
        record = host.require(self.plugin)
        assert record.status == "active", record.reason
        assert record.api, f"plugin '{self.plugin}' declares no PAX_API range in its module"

    def test_registration_imports_and_builds(self, host: PluginHost, registration, tmp_path
                                             ) -> None:
        kind, name = registration
        entry = host.components(kind).get(f"{self.plugin}/{name}")
        factory = entry.load()
        if kind in ("partitioners", "backends", "mesh_layouts"):
            entry.build()
        elif kind == "loggers":
            entry.build(str(tmp_path)).close()
        elif kind == "checkpointers":
            entry.build(str(tmp_path / "checkpoints"), CheckpointSettings(1, 1)).close()
        else:  # models, inputs, experiments, commands: classes, functions or typer apps
            assert callable(factory), f"{kind[:-1]} '{name}' is not callable: {factory!r}"

    def test_experiment_resolves_and_builds(self, host: PluginHost, experiment: str) -> None:
        job = _resolve(host, self.plugin, experiment).build()
        assert sum(d.is_training for d in job.datasets) == 1

    def test_model_returns_a_model_output(self, host: PluginHost, experiment: str) -> None:
        import jax
        import numpy as np

        from pax_core.models.output import ModelOutput

        job = _resolve(host, self.plugin, experiment).build()
        # One process: its share of a batch is the whole global batch.
        batch = next(d for d in job.datasets if d.is_training).abstract_batch()
        model = job.task.model

        def forward(batch):
            variables = model.init(jax.random.PRNGKey(0), batch)
            return model.apply(variables, batch, rngs={"dropout": jax.random.PRNGKey(1)})

        out = jax.eval_shape(forward, batch)
        assert isinstance(out, ModelOutput), f"{type(model).__name__} returned {type(out)}"
        assert out.loss.shape == (), f"loss has shape {out.loss.shape}, not a scalar"
        assert np.issubdtype(out.loss.dtype, np.floating)
        for key, value in out.metrics.items():
            assert isinstance(value, tuple) and len(value) == 2, f"metric {key}: {value!r}"

    def test_input_position_restores_the_next_batch(self, host: PluginHost, experiment: str
                                                    ) -> None:
        job = _resolve(host, self.plugin, experiment).build()
        for data in job.datasets:
            try:
                data.get_next()
            except UsageError as e:
                pytest.skip(f"input '{data.name}' cannot read here: {e}")
            saved = json.dumps(data.get_state())
            try:
                expected = data.get_next()
            except StopIteration:
                continue  # a finite input of one batch: no later batch to come back to
            with contextlib.suppress(StopIteration):
                data.get_next()
            data.set_state(json.loads(saved))
            assert _same(data.get_next(), expected), f"input '{data.name}' did not resume"

    def test_plan_compiles(self, planned_experiment: str) -> None:
        from pax_core.testing import run_pax

        result = run_pax("plan", "--plugin", self.plugin, "--exp", planned_experiment, "--json",
                         timeout=600)
        if result.returncode == 2 and "plugin, which is not installed" in result.stderr:
            pytest.skip(result.stderr.strip())
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["params"] > 0
