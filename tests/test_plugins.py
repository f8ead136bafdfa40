"""The plugin host: isolation of broken plugins, duplicates, selection, strict mode, listing."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap

import pytest

from pax_core import hookimpl
from pax_core.errors import RunError, UsageError
from pax_core.plugins.host import PluginHost, PluginSelection
from pax_core.plugins.notify import RunInfo, notify
from pax_core.plugins.records import Component, ExperimentRef
from pax_core.testing import isolated_host, register_plugin


class Alpha:
    """A well-formed plugin registering an experiment and an input."""

    @hookimpl
    def pax_register_experiments(self):
        return [ExperimentRef("Shared", "pax_core.examples:MlpSynthetic", "alpha's")]

    @hookimpl
    def pax_register_inputs(self):
        return [Component("synthetic", "pax_core.inputs.synthetic:SyntheticInput", "alpha's")]


class Beta:
    """Registers the same experiment name as Alpha."""

    @hookimpl
    def pax_register_experiments(self):
        return [ExperimentRef("Shared", "pax_core.examples:MlpSynthetic", "beta's")]


class Misspelt:
    @hookimpl
    def pax_register_modles(self):
        return []


class WrongArguments:
    @hookimpl
    def pax_on_metrics(self, run, stepz):
        pass


class WrongReturn:
    @hookimpl
    def pax_register_models(self):
        return ["mlp"]


alpha, beta = Alpha(), Beta()


def _entry_point(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group="pax")


@pytest.fixture
def broken_module(tmp_path, monkeypatch):
    (tmp_path / "pax_broken_sample.py").write_text("import this_dependency_is_not_installed\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return "pax_broken_sample"


def test_broken_plugin_is_isolated(broken_module, capsys):
    host = PluginHost(
        PluginSelection(),
        entry_points=[_entry_point("broken", broken_module),
                      _entry_point("alpha", "test_plugins:alpha")],
    )
    assert host.records["broken"].status == "failed"
    assert "ModuleNotFoundError" in host.records["broken"].reason
    assert host.records["alpha"].status == "active"
    assert host.components("experiments").get("Shared").plugin == "alpha"
    warning = capsys.readouterr().err.strip().splitlines()
    assert len(warning) == 1
    assert "plugin 'broken'" in warning[0] and "this_dependency_is_not_installed" in warning[0]


def test_explicitly_requested_broken_plugin_stops_with_original_error(broken_module):
    host = PluginHost(PluginSelection(), entry_points=[_entry_point("broken", broken_module)])
    with pytest.raises(RunError, match="this_dependency_is_not_installed") as info:
        host.require("broken")
    assert isinstance(info.value.__cause__, ModuleNotFoundError)


def test_strict_mode_makes_a_failure_fatal(broken_module):
    with pytest.raises(RunError, match="PAX_STRICT_PLUGINS"):
        PluginHost(PluginSelection(strict=True),
                   entry_points=[_entry_point("broken", broken_module)])


@pytest.mark.parametrize("plugin", [Misspelt, WrongArguments, WrongReturn])
def test_invalid_hooks_mark_the_plugin_failed(plugin, capsys):
    host = isolated_host()
    record = host.register(plugin(), "invalid")
    assert record.status == "failed"
    assert host.pm.get_plugin("invalid") is None
    assert "invalid" in capsys.readouterr().err


def test_same_name_from_two_plugins_is_an_error_naming_both():
    host = PluginHost(PluginSelection(), entry_points=[])
    host.register(Alpha(), "alpha", distribution="pax-alpha", version="1.0")
    host.register(Beta(), "beta", distribution="pax-beta", version="2.0")
    experiments = host.components("experiments")
    with pytest.raises(UsageError) as info:
        experiments.get("Shared")
    assert "pax-alpha 1.0" in str(info.value) and "pax-beta 2.0" in str(info.value)
    assert experiments.get("beta/Shared").component.help == "beta's"
    assert set(experiments.conflicts()) == {"Shared"}


def test_plugin_name_wins_over_builtin_and_builtin_stays_reachable():
    host = isolated_host(("alpha", Alpha()))
    inputs = host.components("inputs")
    assert inputs.get("synthetic").plugin == "alpha"
    assert inputs.get("core/synthetic").plugin == "core"


def test_disable_and_allow_list(monkeypatch):
    eps = [_entry_point("alpha", "test_plugins:alpha"), _entry_point("beta", "test_plugins:beta")]
    monkeypatch.setenv("PAX_DISABLE_PLUGINS", "beta")
    monkeypatch.delenv("PAX_PLUGINS", raising=False)
    host = PluginHost(PluginSelection.from_env(), entry_points=eps)
    assert [host.records[n].status for n in ("alpha", "beta")] == ["active", "disabled"]

    monkeypatch.delenv("PAX_DISABLE_PLUGINS")
    monkeypatch.setenv("PAX_PLUGINS", "")
    host = PluginHost(PluginSelection.from_env(), entry_points=eps)
    assert {n for n, r in host.records.items() if r.status == "active"} == {"core"}
    with pytest.raises(UsageError, match="allow-list"):
        host.require("alpha")

    host = PluginHost(PluginSelection.from_env(allow="beta"), entry_points=eps)
    assert host.records["beta"].status == "active"
    assert host.records["alpha"].status == "disabled"


def test_notification_that_raises_is_reported_and_others_still_run(capsys):
    told = []

    class Faulty:
        @hookimpl
        def pax_on_train_end(self, run, step, status):
            raise ValueError("boom")

    class Listener:
        @hookimpl
        def pax_on_train_end(self, run, step, status):
            told.append((step, status))

    host = isolated_host(("faulty", Faulty()), ("listener", Listener()))
    notify(host.pm, "pax_on_train_end", run=RunInfo("x", "/tmp", 1, 0), step=3,
           status="completed")
    assert told == [(3, "completed")]
    assert "plugin 'faulty' raised in pax_on_train_end: ValueError: boom" in capsys.readouterr().err


def test_register_plugin_lasts_one_block():
    host = isolated_host()
    with register_plugin(host, Beta(), "beta"):
        assert host.components("experiments").get("Shared").plugin == "beta"
    with pytest.raises(UsageError, match="unknown experiment"):
        host.components("experiments").get("Shared")


# Through the installed command: a real distribution on disk with a broken entry point.


def _fake_distribution(site, name: str, module_source: str) -> None:
    dist = site / f"pax_{name}-0.3.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: pax-{name}\nVersion: 0.3.0\n")
    (dist / "entry_points.txt").write_text(f"[pax]\n{name} = pax_{name}_plugin\n")
    (site / f"pax_{name}_plugin.py").write_text(textwrap.dedent(module_source))


def _pax(args, site, **env):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PAX_")}
    environ["PYTHONPATH"] = str(site)
    environ.update(env)
    return subprocess.run([sys.executable, "-m", "pax_core.cli.main", *args], env=environ,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def site(tmp_path):
    site = tmp_path / "site"
    _fake_distribution(site, "broken", "import this_dependency_is_not_installed\n")
    return site


def test_plugin_exiting_at_import_or_with_markup_in_its_error_is_listed(tmp_path):
    site = tmp_path / "site"
    _fake_distribution(site, "exits", "import sys\nsys.exit('missing native lib')\n")
    _fake_distribution(site, "markup", "raise ImportError('no libcudart in [/usr/local/cuda]')\n")
    result = _pax(["plugins"], site, COLUMNS="400")
    assert result.returncode == 0, result.stderr
    assert "SystemExit: missing native lib" in result.stdout
    assert "[/usr/local/cuda]" in result.stdout
    assert _pax(["--help"], site).returncode == 0


def test_two_plugins_with_one_command_name(tmp_path):
    site = tmp_path / "site"
    for name, word in (("cmda", "alpha"), ("cmdb", "beta")):
        _fake_distribution(site, name, f"""
            import typer
            from pax_core import hookimpl
            from pax_core.plugins.records import Component

            def hello():
                typer.echo("{word}")

            @hookimpl
            def pax_register_commands():
                return [Component("hello", "pax_{name}_plugin:hello", "say hello")]
        """)
    ambiguous = _pax(["hello"], site)
    assert ambiguous.returncode == 2
    assert "pax-cmda 0.3.0" in ambiguous.stderr and "pax-cmdb 0.3.0" in ambiguous.stderr
    chosen = _pax(["cmdb/hello"], site)
    assert (chosen.returncode, chosen.stdout) == (0, "beta\n")


def test_pax_plugins_lists_failed_plugin_with_its_reason(site):
    result = _pax(["plugins", "--json"], site)
    assert result.returncode == 0, result.stderr
    plugins = {p["name"]: p for p in json.loads(result.stdout)["plugins"]}
    assert plugins["broken"]["status"] == "failed"
    assert plugins["broken"]["distribution"] == "pax-broken"
    assert plugins["broken"]["version"] == "0.3.0"
    assert "this_dependency_is_not_installed" in plugins["broken"]["reason"]
    assert plugins["testplugin"]["status"] == "active"
    assert plugins["testplugin"]["registered"]["experiments"] == ["TinyCounting"]
    assert plugins["core"]["registered"]["partitioners"] == ["data_parallel", "spmd"]
    assert "pax-broken 0.3.0" in result.stderr


def test_cli_strict_mode_and_explicit_plugin_fail(site):
    strict = _pax(["plugins"], site, PAX_STRICT_PLUGINS="1")
    assert strict.returncode == 1
    assert "this_dependency_is_not_installed" in strict.stderr
    assert "Traceback" not in strict.stderr
    asked = _pax(["config", "--plugin", "broken", "--exp", "Anything"], site)
    assert asked.returncode == 1
    assert "plugin 'broken' (pax-broken 0.3.0) failed to load" in asked.stderr


def test_cli_switches_select_plugins(site):
    result = _pax(["--disable-plugins", "broken,testplugin", "plugins", "--json"], site)
    plugins = {p["name"]: p["status"] for p in json.loads(result.stdout)["plugins"]}
    assert {n: plugins[n] for n in ("core", "broken", "testplugin")} == {
        "core": "active", "broken": "disabled", "testplugin": "disabled"}
    assert result.stderr == ""
    result = _pax(["--plugins=", "plugins", "--json"], site)
    plugins = {p["name"]: p["status"] for p in json.loads(result.stdout)["plugins"]}
    assert [n for n, s in plugins.items() if s == "active"] == ["core"]


def test_help_and_plugins_do_not_import_jax(site):
    probe = textwrap.dedent("""
        import sys
        from pax_core.cli.main import main
        for argv in (["--help"], ["plugins"], ["experiments"]):
            try:
                main(argv)
            except SystemExit as e:
                assert e.code == 0, (argv, e.code)
        heavy = sorted(m for m in ("jax", "flax", "optax", "orbax", "fiddle") if m in sys.modules)
        print("HEAVY:" + ",".join(heavy))
    """)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PAX_")}
    environ["PYTHONPATH"] = str(site)
    result = subprocess.run([sys.executable, "-c", probe], env=environ, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "HEAVY:"
    assert "pax-broken 0.3.0" in result.stderr
