"""The plugin API: its frozen surface, versions and deprecations, and hooks through pluggy."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from repo_packages import PACKAGES

import pax_core
from pax_core import testing
from pax_core.errors import UsageError
from pax_core.plugins.notify import RunInfo, notify
from pax_core.testing import isolated_host

ROOT = Path(__file__).resolve().parents[1]

# The public surface. Changing it is a decision: a new name is a minor version of API_VERSION,
# a removed or renamed one a major version (or a deprecation, see pax_core._DEPRECATED).
API = [
    "API_VERSION", "ATTENTION_RESIDUALS", "Adafactor", "Adam", "Backend", "CheckpointSettings",
    "Checkpointer", "Component", "Constant", "CpuBackend", "DamagedCheckpoint",
    "DistributedOptions",
    "EarlyStopping", "EvalResult", "ExpOpt", "Experiment", "ExperimentRef", "IndexedInput",
    "Input", "Job", "JobDirOpt", "JobRequest", "JsonOpt", "Learner", "LinearRampupCosineDecay",
    "LinearRampupExponentialDecay", "LinearRampupPiecewiseConstant", "Lion", "LoadedJob", "Logger",
    "MeshLayout",
    "MlpClassifier", "ModelOutput", "Optimizer", "Partitioner", "PaxError", "PlatformOpt",
    "PluginHost", "PluginOpt", "Preset", "RecordedExpOpt", "Reduction", "RestoreStepOpt",
    "Restored", "Run", "RunError", "RunInfo", "SetOpt", "Sgd", "SingleTaskExperiment",
    "SourceModel", "Spmd", "Stopped", "SyntheticInput", "Task", "TpuBackend", "Train",
    "TrainResult", "TrainState", "UsageError", "WeightFormat", "Weights", "__version__",
    "accelerator_platform", "apply_presets", "axes", "choose_experiment", "dot_product_attention",
    "evaluate", "fingerprint", "held", "hookimpl", "is_held", "job_command", "job_request",
    "key_paths", "load", "make_tf_example", "mean_across_shards", "parse_flags",
    "parse_tf_example", "platform_backends", "public_face", "require_files", "restore_latest",
    "tfds_split_files", "train", "warn", "write_atomic",
]
TESTING_API = [
    "KillTrials", "PluginConformance", "PluginHost", "assert_same_params", "build_run", "cpu_mesh",
    "cpu_xla_flags",
    "evaluate", "export_params", "fault_trials", "first_batch_losses", "first_batch_steps",
    "going_down", "import_job",
    "isolated_host", "kill_and_compare", "kill_trials", "pax_host", "plan", "read_metrics",
    "read_params", "register_plugin", "resolve", "run_pax", "splash_served", "step_flops",
    "stop_once_saved",
    "train", "train_losses", "use_cpu_devices", "use_fake_devices",
]
PLUGIN_SOURCES = [p.source for p in PACKAGES if p.module != "pax_core"]
PLUGIN_TESTS = [p.tests for p in PACKAGES if p.module != "pax_core"]


def _installed(tmp_path: Path, name: str, source: str) -> dict[str, str]:
    """A distribution pax-NAME with a plugin module on disk; the environment that sees it."""
    site = tmp_path / "site"
    dist = site / f"pax_{name}-0.3.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: pax-{name}\nVersion: 0.3.0\n")
    (dist / "entry_points.txt").write_text(f"[pax]\n{name} = pax_{name}_plugin\n")
    (site / f"pax_{name}_plugin.py").write_text(textwrap.dedent(source))
    return {**{k: v for k, v in os.environ.items() if not k.startswith("PAX_")},
            "PYTHONPATH": str(site)}


def _pax(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pax_core.cli.main", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_public_surface_is_frozen():
    assert sorted(pax_core.__all__) == sorted(API)
    assert sorted(testing.__all__) == sorted(TESTING_API)
    for name in API:
        assert getattr(pax_core, name) is not None, name
    for name in TESTING_API:
        assert getattr(testing, name) is not None, name


def test_the_plugin_guide_names_every_public_name():
    guide = (ROOT / "docs" / "plugins.md").read_text()
    table = guide[guide.index("| for | names |"):guide.index("## The hooks")]
    named = set(re.findall(r"`([A-Za-z_]\w*)`", table))
    assert set(API) - {"API_VERSION", "__version__"} <= named
    assert set(TESTING_API) <= named
    assert named - set(API) - set(TESTING_API) == set(), "names the API does not have"


def test_api_version_is_semantic():
    major, minor, patch = (int(p) for p in pax_core.API_VERSION.split("."))
    assert (major, minor, patch) >= (1, 0, 0)


def test_importing_the_api_does_not_start_jax():
    probe = ("import sys, pax_core; "
             "from pax_core import Component, ExperimentRef, hookimpl, UsageError, axes; "
             "print(sorted(m for m in ('jax', 'flax', 'optax', 'orbax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        pax_core.Nope  # noqa: B018


def test_a_renamed_name_warns_and_answers(monkeypatch):
    monkeypatch.setitem(pax_core._DEPRECATED, "ModelOutputs", ("ModelOutput", "1.2"))
    with pytest.warns(DeprecationWarning, match=r"pax_core.ModelOutputs .* API 1.2; use "
                                                 r"pax_core.ModelOutput"):
        old = pax_core.ModelOutputs
    assert old is pax_core.ModelOutput


def test_a_name_moved_to_a_plugin_package_warns_and_names_it(monkeypatch):
    """A moved name warns, and names the package to install when it is absent."""
    monkeypatch.setitem(pax_core._MOVED, "Gone", ("pax_nowhere", "1.13"))
    with pytest.warns(DeprecationWarning, match=r"pax_core.Gone moved to pax_nowhere .* API "
                                                 r"1.13; use pax_nowhere.Gone"), \
            pytest.raises(AttributeError, match="pip install pax-nowhere"):
        pax_core.Gone  # noqa: B018


@pytest.mark.parametrize(("command", "package"), [("sweep", "pax-sweep"), ("decode", "pax-lm")])
def test_a_command_of_a_package_not_loaded_names_the_package(command, package):
    result = _pax("--plugins", "", command, "--job-dir", "x", env=dict(os.environ))
    assert result.returncode == 2
    assert result.stderr == (f"pax: error: pax {command} comes with {package}, which is not "
                             f"installed (or is disabled): pip install {package}\n")


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports by its absolute name."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


@pytest.mark.parametrize("package", [p for p in PACKAGES if p.module != "pax_core"],
                         ids=lambda p: p.module)
def test_packages_import_only_each_others_public_faces(package):
    """A plugin package imports another package by its public face (``pax_transformer``),
    never one of its modules (``pax_transformer.layers.attention``)."""
    others = {p.module for p in PACKAGES} - {package.module, "pax_core"}
    reaching = {f"{p.relative_to(ROOT)}: {m}"
                for folder in (package.source, package.tests) for p in (ROOT / folder).rglob("*.py")
                for m in _imports(p) if m.split(".")[0] in others and "." in m}
    assert not reaching


@pytest.mark.parametrize("source", PLUGIN_SOURCES + PLUGIN_TESTS)
def test_plugins_import_only_the_public_api(source):
    allowed = {"pax_core", "pax_core.testing"} if source in PLUGIN_TESTS else {"pax_core"}
    reaching = {f"{p.relative_to(ROOT)}: {m}" for p in (ROOT / source).rglob("*.py")
                for m in _imports(p) if m.split(".")[0] == "pax_core" and m not in allowed}
    assert not reaching


# API ranges.


class Declares:
    def __init__(self, api):
        self.PAX_API = api

    @pax_core.hookimpl
    def pax_register_models(self):
        return [pax_core.Component("declared", "pax_core.models.mlp:MlpClassifier")]


def test_a_plugin_in_range_is_active_and_shows_its_range():
    host = isolated_host(("fits", Declares(">=1.0,<2")))
    record = host.records["fits"]
    assert (record.status, record.api) == ("active", ">=1.0,<2")
    assert host.components("models").get("fits/declared")


def test_a_plugin_for_another_api_is_refused_naming_both_versions(capsys):
    host = isolated_host(("future", Declares(">=2.0,<3")))
    record = host.records["future"]
    assert record.status == "incompatible"
    assert record.reason == (f"built for pax API >=2.0,<3, but this pax-core provides API "
                             f"{pax_core.API_VERSION}")
    assert "declared" not in [e.name for e in host.components("models")]
    assert not host.pm.is_registered(host.pm.get_plugin("future"))
    assert "plugin 'future'" in capsys.readouterr().err
    with pytest.raises(UsageError, match=r"plugin 'future' .* is built for pax API >=2.0,<3"):
        host.require("future")


def test_a_malformed_range_fails_the_plugin():
    record = isolated_host(("odd", Declares("one point oh"))).records["odd"]
    assert record.status == "failed"
    assert "is not a version specifier" in record.reason


def test_pax_plugins_shows_an_incompatible_plugin(tmp_path):
    env = _installed(tmp_path, "future", 'PAX_API = ">=2,<3"\n')
    data = json.loads(_pax("plugins", "--json", env=env).stdout)
    assert data["api_version"] == pax_core.API_VERSION
    future = next(p for p in data["plugins"] if p["name"] == "future")
    assert (future["status"], future["api"]) == ("incompatible", ">=2,<3")
    assert pax_core.API_VERSION in future["reason"]
    asked = _pax("experiments", "--plugin", "future", env=env)
    assert asked.returncode == 2
    assert "built for pax API >=2,<3" in asked.stderr and "Traceback" not in asked.stderr


# Hooks through pluggy.


class Metrics:
    def __init__(self):
        self.seen = []

    @pax_core.hookimpl
    def pax_on_metrics(self, run, step, kind, metrics):
        self.seen.append((step, kind))


class Wrapper:
    """Wraps every plugin's registration and notification calls."""

    def __init__(self):
        self.calls = []

    @pax_core.hookimpl(wrapper=True)
    def pax_register_models(self):
        results = yield  # one list of records per implementation
        self.calls.append("register_models")
        extra = pax_core.Component("wrapped", "pax_core.models.mlp:MlpClassifier")
        return [[*records, extra] for records in results]

    @pax_core.hookimpl(wrapper=True)
    def pax_on_metrics(self, run, step, kind, metrics):
        self.calls.append(("metrics", step))
        return (yield)


def test_pax_plugins_lists_the_hooks_a_plugin_implements():
    host = isolated_host(("listener", Metrics()))
    record = host.records["listener"]
    assert record.hooks == ["pax_on_metrics"]
    assert record.registered == {}
    assert host.records["core"].hooks[:2] == ["pax_register_backends",
                                              "pax_register_checkpointers"]


def test_hook_wrappers_run_around_registrations_and_notifications():
    wrapper, metrics = Wrapper(), Metrics()
    host = isolated_host(("wrapper", wrapper), ("listener", metrics))
    # Registered first, it still wraps the registrations of plugins that came later.
    host.unregister("listener")
    host.register(Declares(">=1,<2"), "declares")
    assert "register_models" in wrapper.calls
    assert host.components("models").get("declares/wrapped")
    host.register(metrics, "listener")
    notify(host.pm, "pax_on_metrics", run=RunInfo("e", "/tmp", 1, 0), step=7, kind="train",
           metrics={})
    assert metrics.seen == [(7, "train")]
    assert ("metrics", 7) in wrapper.calls


def test_entry_point_wrappers_see_every_plugins_registration(tmp_path):
    env = _installed(tmp_path, "wraps", """
        import sys
        from pax_core import hookimpl

        @hookimpl(wrapper=True)
        def pax_register_models():
            results = yield
            print("wrapped", [c.name for r in results for c in r], file=sys.stderr)
            return results
    """)
    result = _pax("plugins", env=env)
    assert "wrapped ['mlp']" in result.stderr  # the core's, loaded before the wrapper
    assert "wrapped ['tiny_lm']" in result.stderr  # the test plugin's


def test_trace_prints_each_hook_call_with_its_duration():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAX_")}
    traced = _pax("experiments", env={**env, "PAX_TRACE_PLUGINS": "1"})
    lines = [line for line in traced.stderr.splitlines() if line.startswith("pax: trace: ")]
    assert any(line.startswith("pax: trace: pax_register_experiments [testplugin] ")
               and line.endswith(" ms") for line in lines), traced.stderr
    assert "pax: trace:" not in _pax("experiments", env=env).stderr


def test_an_unhashable_plugin_is_refused_clearly():
    import types

    record = isolated_host(("ns", types.SimpleNamespace())).records["ns"]
    assert record.status == "failed"
    assert "must be a module or a hashable object" in record.reason
