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
  every registered model is the model of one of the plugin's experiments (whose model the
  suite runs), every input a ``pax_core.Input``, every command a typer app or a function;
* every experiment (``experiments``: all, or the names given) resolves and its config builds;
* its model returns a ``ModelOutput`` with a scalar loss on a batch of its training input's
  shapes (``jax.eval_shape``, so full-size models cost nothing);
* every dataset's position saves as JSON and restores to the same next batch, each experiment
  resolved with the ``--set`` items of the ``data_settings`` fixture (data made for the test,
  in the real data's format, where the real data is not on the machine);
* ``pax plan`` compiles each of ``plan_experiments`` (default: the same experiments) on fake
  devices of its mesh, in a subprocess as a user runs it;
* every optimizer of the core (``--set OPTIMIZER=...``) drives the training loss of
  ``trained_experiment`` (a tiny one, when named) down within a few steps, with the ``--set``
  items of the ``trained_settings`` fixture (where its data is, say).

Experiments that need a plugin which is not installed are skipped, and so are input checks whose
data is neither on this machine nor given by ``data_settings``, each with the reason.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
from collections.abc import Sequence
from typing import Any

import pytest

from pax_core.checkpointers.base import CheckpointSettings
from pax_core.errors import UsageError
from pax_core.plugins.host import PluginHost

# Each optimizer of the core (OPTIMIZER's table; a test checks this covers it), and a learning
# rate it learns a tiny model with at a constant rate.
LEARNING_RATES = {"adam": 3e-3, "adafactor": 3e-3, "lion": 3e-3, "sgd": 0.03}
TRAIN_STEPS = 8


def going_down(losses: Sequence[float]) -> bool:
    """Whether training losses fall: the last below the first, and at least three steps in four
    lowering the loss (a wrongly wired optimizer leaves them flat, or climbing)."""
    falls = sum(later < earlier for earlier, later in itertools.pairwise(losses))
    return losses[-1] < losses[0] and falls >= 0.75 * (len(losses) - 1)


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
    if "optimizer" in metafunc.fixturenames:
        metafunc.parametrize("optimizer", list(LEARNING_RATES) if cls.trained_experiment else [])


def _resolve(host: PluginHost, plugin: str, experiment: str, settings: Sequence[str] = ()):
    from pax_core.config.resolve import resolve

    try:
        return resolve(host, experiment, plugin, list(settings))
    except UsageError as e:
        if "plugin, which is not installed" in str(e):
            pytest.skip(str(e))
        raise


@functools.cache
def _experiment_models(plugin: str) -> tuple[Any, ...]:
    """The model classes of the plugin's experiments (those that resolve here)."""
    import fiddle as fdl

    from pax_core.config.resolve import resolve

    models = []
    for name in _experiments(plugin, None):
        with contextlib.suppress(UsageError):  # it needs a plugin that is not installed
            models.append(fdl.get_callable(resolve(_host(), name, plugin, []).config.task.model))
    return tuple(models)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import numpy as np

    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


class PluginConformance:
    """Subclass in a plugin's tests and set ``plugin``; see the module's documentation."""

    plugin: str = ""
    experiments: Sequence[str] | None = None
    plan_experiments: Sequence[str] | None = None
    trained_experiment: str | None = None

    @pytest.fixture(scope="class")
    @classmethod
    def host(cls) -> PluginHost:
        return _host()

    @pytest.fixture
    def trained_settings(self) -> list[str]:
        """``--set`` items ``trained_experiment`` trains with (override to give its data)."""
        return []

    @pytest.fixture
    def data_settings(self, experiment: str) -> list[str]:
        """``--set`` items the input check resolves ``experiment`` with: override to point an
        experiment whose data a test machine lacks at a small stand-in written in the data's
        own format (and a batch that fits it), so its input's position is checked in CI."""
        return []

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
        elif kind == "models":
            assert factory in _experiment_models(self.plugin), (
                f"model '{name}' is the model of none of plugin '{self.plugin}''s experiments: "
                f"register the models an experiment trains (layers are not models)")
        elif kind == "inputs":
            from pax_core.inputs.base import Input

            assert isinstance(factory, type) and issubclass(factory, Input), (
                f"input '{name}' is not a pax_core.Input class: {factory!r}")
        else:  # experiments, commands: classes, functions or typer apps
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

    def test_input_position_restores_the_next_batch(self, host: PluginHost, experiment: str,
                                                    data_settings: list[str]) -> None:
        job = _resolve(host, self.plugin, experiment, data_settings).build()
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
        from pax_core.testing.commands import run_pax

        result = run_pax("plan", "--plugin", self.plugin, "--exp", planned_experiment, "--json",
                         timeout=600)
        if result.returncode == 2 and "plugin, which is not installed" in result.stderr:
            pytest.skip(result.stderr.strip())
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["params"] > 0

    def test_every_optimizer_learns(self, host: PluginHost, optimizer: str,
                                    trained_settings: list[str]) -> None:
        from pax_core.testing.training import first_batch_losses

        losses = first_batch_losses(
            host, self.trained_experiment, self.plugin,
            [*trained_settings, f"OPTIMIZER={optimizer}", "LR_SCHEDULE=constant",
             f"LEARNING_RATE={LEARNING_RATES[optimizer]}"], steps=TRAIN_STEPS)
        assert going_down(losses), f"{optimizer}: losses {losses}"
