"""From ``--exp`` and ``--set`` to a resolved config: look-up, overrides, ``pax config``.

Covers experiment look-up in every accepted form (registered name, ``plugin/name``, dotted
suffixes of class paths and aliases, ``module:Class``, ``file.py:Class``, ``--plugin``), ambiguous
and unknown names; ``--set`` and ``--fdl.`` overrides of constants and config paths with their
type checks; the exit code 2 and untouched job directory every mistake ends with; and the text
and JSON that ``pax config`` prints.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import types
from collections.abc import Sequence

import fiddle as fdl
import pytest
from fiddle.experimental import serialization

from pax_core import hookimpl
from pax_core.cli.main import main
from pax_core.config import overrides
from pax_core.config.optimizers import Adam
from pax_core.config.resolve import resolve
from pax_core.config.task import Train
from pax_core.errors import UsageError
from pax_core.plugins.records import ExperimentRef
from pax_core.testing import isolated_host, register_plugin

SCHEDULE = "task.train.learner.optimizer.lr_schedule"


@pytest.fixture(autouse=True)
def _all_installed_plugins(monkeypatch):
    """The CLI tests rely on the installed test plugin, whatever the caller's environment says."""
    monkeypatch.delenv("PAX_PLUGINS", raising=False)
    monkeypatch.delenv("PAX_DISABLE_PLUGINS", raising=False)


@pytest.fixture
def host():
    return isolated_host(("testplugin", importlib.import_module("pax_testplugin.plugin")))


def _pax(capsys, *argv: str) -> tuple[int, str, str]:
    """Run ``pax ARGV`` in-process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err


def _config_lines(capsys, *set_items: str) -> list[str]:
    """The ``path = value`` lines ``pax config`` prints for MlpSynthetic with these overrides."""
    argv = ["config", "--exp", "MlpSynthetic"]
    for item in set_items:
        argv += ["--set", item]
    code, out, err = _pax(capsys, *argv)
    assert (code, err) == (0, "")
    return out.splitlines()


# --set: constants and paths


def test_constant_override_reaches_every_value_derived_from_it(capsys):
    lines = _config_lines(capsys, "NUM_TRAIN_STEPS=50")
    assert "task.train.num_train_steps = 50" in lines
    assert f"{SCHEDULE}.decay_end = 50" in lines


def test_constant_override_applies_before_task_runs(host):
    resolved = resolve(host, "MlpSynthetic", None, ["NUM_TRAIN_STEPS=4"])
    assert resolved.experiment.NUM_TRAIN_STEPS == 4
    assert resolved.config.task.train.num_train_steps == 4
    assert resolved.config.task.train.learner.optimizer.lr_schedule.decay_end == 4


def test_list_constant_keeps_the_tuple_type_of_the_constant(capsys):
    assert "task.model.hidden_dims = (8, 8)" in _config_lines(capsys, "HIDDEN_DIMS=[8,8]")


@pytest.mark.parametrize(
    ("item", "line"),
    [
        ("task.model.num_classes=3", "task.model.num_classes = 3"),
        ("task.train.learner.optimizer.learning_rate=1e-4",
         "task.train.learner.optimizer.learning_rate = 0.0001"),
        ("task.train.learner.optimizer.learning_rate=1",
         "task.train.learner.optimizer.learning_rate = 1.0"),
        ("task.model.hidden_dims=[8]", "task.model.hidden_dims = (8,)"),
        ("datasets[0].kind=tokens", "datasets[0].kind = 'tokens'"),
        ("datasets[0].kind='tokens'", "datasets[0].kind = 'tokens'"),
        ("datasets[1].is_training=false", "datasets[1].is_training = False"),
        ("task.train.max_inflight_steps=3", "task.train.max_inflight_steps = 3"),
        ("datasets[1].name=true", "datasets[1].name = 'true'"),
    ],
    ids=["int", "float", "int-into-float", "list-into-tuple", "bare-word-into-str",
         "quoted-str", "bool", "default-not-set-by-experiment", "bool-word-into-str"],
)
def test_path_override_sets_a_value_of_the_field_type(capsys, item, line):
    assert line in _config_lines(capsys, item)


def test_list_index_path_changes_only_that_entry(capsys):
    lines = _config_lines(capsys, "datasets[1].batch_size=32")
    assert "datasets[1].batch_size = 32" in lines
    assert "datasets[0].batch_size = 64" in lines


def test_fdl_spelling_means_the_same_as_set(capsys):
    code, out, _ = _pax(capsys, "config", "--exp", "MlpSynthetic", "--fdl.task.model.num_classes=3")
    assert code == 0
    assert out.splitlines() == _config_lines(capsys, "task.model.num_classes=3")


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("task.model.num_clases=3", "unknown field num_clases of task.model (MlpClassifier); "
                                    "did you mean num_classes?"),
        ("NUM_TRAIN_STEP=4", "unknown field NUM_TRAIN_STEP of experiment MlpSynthetic; "
                             "did you mean NUM_TRAIN_STEPS?"),
        ("num_train_steps=4", "unknown field num_train_steps of experiment MlpSynthetic; "
                              "did you mean NUM_TRAIN_STEPS?"),
        ("datasets[2].seed=1", "datasets has 2 entries; [2] is out of range"),
        ("task.model.num_classes=1.5", "task.model.num_classes expects int, got float 1.5"),
        ("NUM_TRAIN_STEPS=4.0", "NUM_TRAIN_STEPS expects int, got float 4.0"),
        ("task.train.learner.optimizer.learning_rate=true",
         "learning_rate expects float, got bool True"),
        ("task.model=3", "task.model is a configured MlpClassifier; set its fields instead"),
        ("task.model.num_classes=[1", "'[1' is not a Python literal"),
        ("datasets[0].seed={[1]: 2}", "'{[1]: 2}' is not a Python literal"),
        ("NUM_TRAIN_STEPS", "expected KEY=VALUE"),
    ],
    ids=["path-typo", "constant-typo", "constant-in-lower-case", "index-out-of-range",
         "float-into-int", "float-into-int-constant", "bool-into-float", "config-replaced-by-value",
         "bad-literal", "unhashable-literal", "key-without-value"],
)
def test_override_mistake_exits_2_before_the_job_dir_is_written(capsys, tmp_path, item, message):
    job_dir = tmp_path / "job"
    code, out, err = _pax(capsys, "train", "--exp", "MlpSynthetic", "--job-dir", str(job_dir),
                          "--set", item)
    assert code == 2
    assert err.startswith("pax: error: ")
    assert message in err
    assert err.count("\n") == 1
    assert out == ""
    assert not job_dir.exists()


# --set on fields an experiment leaves to their defaults


@dataclasses.dataclass
class _Layers:
    widths: Sequence[int]
    names: list[str] = dataclasses.field(default_factory=list)


def test_required_field_left_unset_can_be_set():
    cfg = fdl.Config(_Layers)
    overrides.apply_path(cfg, overrides.Override("widths", "[4, 4]"))
    assert fdl.build(cfg) == _Layers([4, 4])


def test_sequence_field_refuses_a_scalar():
    with pytest.raises(UsageError, match="widths expects Sequence, got int 4"):
        overrides.apply_path(fdl.Config(_Layers, [8]), overrides.Override("widths", "4"))


def test_field_left_to_a_plain_default_factory_can_be_set():
    cfg = fdl.Config(_Layers, [8])
    overrides.apply_path(cfg, overrides.Override("names", "['first']"))
    assert fdl.build(cfg) == _Layers([8], ["first"])


def test_path_goes_through_fields_left_to_their_default_factory():
    cfg = fdl.Config(Train)
    overrides.apply_path(cfg, overrides.Override("learner.optimizer.learning_rate", "1e-4"))
    assert fdl.build(cfg).learner.optimizer == Adam(learning_rate=1e-4)


# --exp: look-up


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("MlpSynthetic", "core/MlpSynthetic"),
        ("core/MlpSynthetic", "core/MlpSynthetic"),
        ("examples.MlpSynthetic", "core/MlpSynthetic"),
        ("pax_core.examples.MlpSynthetic", "core/MlpSynthetic"),
        ("TinyCounting", "testplugin/TinyCounting"),
        ("testplugin/TinyCounting", "testplugin/TinyCounting"),
        ("experiments.TinyCounting", "testplugin/TinyCounting"),
        ("tasks.test.params.counting.TinyCountingLegacy", "testplugin/TinyCounting"),
        ("counting.TinyCountingLegacy", "testplugin/TinyCounting"),
        ("TinyCountingLegacy", "testplugin/TinyCounting"),
    ],
)
def test_registered_experiment_is_found_by_every_name_it_answers_to(host, query, name):
    assert resolve(host, query, None, []).name == name


def test_module_colon_class_needs_no_plugin(host, tmp_path, monkeypatch):
    (tmp_path / "my_experiments.py").write_text(
        "from pax_core.examples import MlpSynthetic\n\n\n"
        "class Wide(MlpSynthetic):\n"
        "    HIDDEN_DIMS = (256,)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    resolved = resolve(host, "my_experiments:Wide", None, [])
    assert resolved.name == "my_experiments:Wide"
    assert resolved.config.task.model.hidden_dims == (256,)


def test_one_class_has_one_name_however_it_is_spelt(host):
    names = {resolve(host, q, None, []).name
             for q in ("MlpSynthetic", "examples.MlpSynthetic", "pax_core.examples:MlpSynthetic")}
    assert names == {"core/MlpSynthetic"}


def test_file_colon_class_loads_a_users_own_file(host, tmp_path, monkeypatch):
    (tmp_path / "exps").mkdir()
    (tmp_path / "exps" / "mine.py").write_text(
        "from pax_core.examples import MlpSynthetic\n\n\n"
        "class ThreeClasses(MlpSynthetic):\n"
        "    NUM_CLASSES = 3\n"
    )
    monkeypatch.chdir(tmp_path)
    resolved = resolve(host, "exps/mine.py:ThreeClasses", None, [])
    assert resolved.name == f"{tmp_path / 'exps' / 'mine.py'}:ThreeClasses"
    assert resolved.config.task.model.num_classes == 3


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("exps/missing.py:Small", "no such file exps/missing.py"),
        ("pax_core.examples:Missing", "pax_core.examples has no attribute 'Missing'"),
        ("pax_core.missing:Small", "importing pax_core.missing failed: ModuleNotFoundError"),
        ("pax_core.examples:fdl", "fdl is not a pax_core.Experiment class"),
        (":MlpSynthetic", "expected module:Class or path/to/file.py:Class"),
    ],
)
def test_bad_class_target_is_a_usage_error(host, query, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        resolve(host, query, None, [])


def test_suffix_two_experiments_share_is_ambiguous(host):
    twin = types.ModuleType("twin")
    twin.pax_register_experiments = hookimpl(lambda: [ExperimentRef(
        "TwinCounting", "pax_testplugin.experiments:TinyCounting",
        aliases=("tasks.other.params.counting.TinyCountingLegacy",))])
    with register_plugin(host, twin, "twin"):
        with pytest.raises(UsageError, match=re.escape(
                "experiment 'counting.TinyCountingLegacy' is ambiguous: "
                "testplugin/TinyCounting, twin/TwinCounting; give more of its path")):
            resolve(host, "counting.TinyCountingLegacy", None, [])
        resolved = resolve(host, "test.params.counting.TinyCountingLegacy", None, [])
        assert resolved.name == "testplugin/TinyCounting"


@pytest.mark.parametrize("query", ["MlpSynthtic", "examples.MlpSynthtic"])
def test_unknown_experiment_lists_the_closest_names(host, query):
    with pytest.raises(UsageError, match=re.escape(
            f"unknown experiment '{query}'; closest: MlpSynthetic")):
        resolve(host, query, None, [])


def test_plugin_option_restricts_the_lookup_to_that_plugin(host):
    assert resolve(host, "TinyCounting", "testplugin", []).name == "testplugin/TinyCounting"
    with pytest.raises(UsageError, match="unknown experiment 'MlpSynthetic' in plugin "
                                         "'testplugin'"):
        resolve(host, "MlpSynthetic", "testplugin", [])
    with pytest.raises(UsageError, match="'core/MlpSynthetic' is not from plugin 'testplugin'"):
        resolve(host, "core/MlpSynthetic", "testplugin", [])


def test_plugin_option_must_name_an_installed_plugin(host):
    with pytest.raises(UsageError, match="unknown plugin 'missing'; installed plugins: core, "
                                         "testplugin"):
        resolve(host, "MlpSynthetic", "missing", [])


def test_cli_finds_an_installed_plugins_experiment_by_its_alias(capsys):
    code, out, _ = _pax(capsys, "config", "--plugin", "testplugin",
                        "--exp", "tasks.test.params.counting.TinyCountingLegacy")
    assert code == 0
    assert "task.model.vocab_size = 32" in out.splitlines()


def test_cli_unknown_experiment_exits_2_with_the_closest_names(capsys):
    code, out, err = _pax(capsys, "config", "--exp", "TinyCountin")
    assert (code, out) == (2, "")
    assert err == "pax: error: unknown experiment 'TinyCountin'; closest: TinyCounting\n"


# pax config


def test_config_prints_one_path_equals_value_line_per_field(capsys):
    lines = _config_lines(capsys)
    assert "task.model.num_classes = 4" in lines
    assert "datasets[0].name = 'train'" in lines
    assert all(re.fullmatch(r"[\w.\[\]]+ = .+", line) for line in lines)


def test_config_json_loads_back_to_the_same_config(capsys):
    code, out, _ = _pax(capsys, "config", "--exp", "MlpSynthetic", "--json",
                        "--set", "task.model.num_classes=3")
    assert code == 0
    assert out.endswith("}\n")
    expected = resolve(isolated_host(), "MlpSynthetic", None, ["task.model.num_classes=3"])
    assert serialization.load_json(out) == expected.config


def test_experiment_needing_a_missing_plugin_says_which(host, tmp_path, monkeypatch):
    (tmp_path / "needs_plugin.py").write_text(
        "from pax_core.examples import MlpSynthetic\n\n\n"
        "class Pipelined(MlpSynthetic):\n"
        "    REQUIRED_PLUGINS = ('pax-not-installed',)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UsageError, match=re.escape(
            "experiment needs_plugin:Pipelined needs the pax-not-installed plugin, which is not "
            "installed (pip install pax-not-installed)")):
        resolve(host, "needs_plugin:Pipelined", None, [])


def test_a_constant_answers_to_its_aliases_in_set_and_in_a_subclass():
    from pax_core.examples import MlpSynthetic

    class Renamed(MlpSynthetic):
        constant_aliases = {"OLD_STEPS": "NUM_TRAIN_STEPS"}

    class Subclass(Renamed):
        OLD_STEPS = 7

    assert Subclass.NUM_TRAIN_STEPS == 7 and "OLD_STEPS" not in vars(Subclass)
    set_old = overrides.apply_constants(Renamed, overrides.parse(["OLD_STEPS=9"]))
    assert set_old.NUM_TRAIN_STEPS == 9


@pytest.mark.parametrize(("items", "message"), [
    (["PERCORE_BATCH_SIZE=2"], "must set one of PERCORE_BATCH_SIZE and BATCH_SIZE, not both"),
    (["BATCH_SIZE=None"], "must set one of PERCORE_BATCH_SIZE and BATCH_SIZE, not neither"),
])
def test_the_global_batch_is_one_of_two_constants(items, message):
    with pytest.raises(UsageError, match=message):
        resolve(isolated_host(), "MlpSynthetic", None, items)


def test_per_core_batch_counts_the_devices():
    import jax

    config = resolve(isolated_host(), "MlpSynthetic", None,
                     ["BATCH_SIZE=None", "PERCORE_BATCH_SIZE=2"]).config
    assert config.datasets[0].batch_size == 2 * jax.device_count()
