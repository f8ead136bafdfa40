"""The `pax` command's conventions: listings that survive pipes and narrow terminals, --format,
--version, -h, completion, help as wide as the terminal, one metavar style, the constants --set
takes, a missing platform's remedy, and a `pax --help` that imports nothing heavy."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from pax_core import API_VERSION, __version__
from pax_core.cli.app import as_command, build_app, takes_metavar, walk
from pax_core.errors import UsageError
from pax_core.plugins.host import PluginHost
from pax_core.testing import run_pax

LONG_NAME = "C4SpmdPipelineGpt3AdamMLPerfHPBS1p5k768Replicas"
# A placeholder in capitals (DIR, N, KEY=VALUE, HOST:PORT, A,B), or the words an option takes,
# spelled as typed (table|tsv|json).
METAVAR = re.compile(r"[A-Z][A-Z0-9_]*(?:[=:,.][A-Z][A-Z0-9_]*)*"
                     r"|[a-z0-9][a-z0-9_-]*(?:\|[a-z0-9][a-z0-9_-]*)+")


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return PluginHost()


def _pax(host: PluginHost, *args: str, env: dict[str, str] | None = None):
    """``pax ARGS`` in this process, its app built under ``env`` (the terminal's width)."""
    old = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        app = build_app(host)
        return CliRunner().invoke(app, list(args), obj=host, prog_name="pax", env=env)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _experiment_names(host: PluginHost) -> list[str]:
    return [e.name for e in host.components("experiments")]


def test_piped_listings_are_whole_tab_separated_rows(host):
    names = _experiment_names(host)
    assert LONG_NAME in names
    pax = Path(sys.executable).with_name("pax")
    piped = subprocess.run([str(pax), "experiments"], capture_output=True, text=True,
                           timeout=60)  # stdout a pipe, as in pax experiments | grep
    assert piped.returncode == 0, piped.stderr
    header, *rows = piped.stdout.splitlines()
    assert header.split("\t") == ["experiment", "plugin", "class", "description"]
    fields = [row.split("\t") for row in rows]
    assert all(len(f) == 4 for f in fields)
    assert [f[0] for f in fields] == names
    assert [line for line in rows if LONG_NAME in line] == [
        f"{LONG_NAME}\tlm\tpax_lm.experiments.c4:{LONG_NAME}\tPax c4"]
    assert "…" not in piped.stdout

    plugins = subprocess.run([str(pax), "plugins"], capture_output=True, text=True, timeout=60)
    header, *rows = plugins.stdout.splitlines()
    assert header.split("\t")[0] == "plugin" and len(header.split("\t")) == 7
    by_plugin = {row.split("\t")[0]: row.split("\t") for row in rows}
    lm_names = [e.name for e in host.components("experiments") if e.plugin == "lm"]
    assert f"experiments: {', '.join(lm_names)}" in by_plugin["lm"][6]  # every one, uncut


def _first_column(table: str) -> str:
    """The text of a rich table's first column, its folded lines joined."""
    cells = [line.split("│")[1].strip() for line in table.splitlines()
             if line.startswith("│")]
    return "".join(cells)


def test_a_narrow_terminal_table_folds_names_rather_than_cutting_them(host):
    names = _experiment_names(host)
    result = _pax(host, "experiments", "--format", "table", env={"COLUMNS": "60"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 60
    assert "…" not in result.output
    assert _first_column(result.output) == "".join(names)


def test_format_json_is_the_json_flag_and_a_wrong_format_is_one_line(host):
    as_format = _pax(host, "experiments", "--format", "json")
    as_flag = _pax(host, "experiments", "--json")
    assert as_format.exit_code == as_flag.exit_code == 0
    assert as_format.output == as_flag.output
    assert [e["name"] for e in json.loads(as_format.output)] == _experiment_names(host)
    tsv = _pax(host, "plugins", "--format", "tsv")
    assert tsv.output.splitlines()[0].startswith("plugin\tdistribution\t")

    wrong = run_pax("experiments", "--format", "xml")
    assert (wrong.returncode, wrong.stderr) == (
        2, "pax: error: --format xml: expected one of table, tsv, json\n")
    both = run_pax("plugins", "--json", "--format", "tsv")
    assert both.returncode == 2
    assert both.stderr.splitlines() == [
        "pax: error: --json and --format tsv contradict each other; give one"]


def test_version_h_and_completion():
    version = run_pax("--version")
    assert (version.returncode, version.stdout) == (
        0, f"pax {__version__} (plugin API {API_VERSION})\n")
    for command in ([], ["experiments"], ["plugins"], ["plugins", "new"], ["train"],
                    ["launch"], ["decode"], ["transcribe"], ["data"], ["data", "prepare"]):
        short, long = run_pax(*command, "-h"), run_pax(*command, "--help")
        assert short.returncode == long.returncode == 0, (command, short.stderr)
        assert short.stdout == long.stdout and short.stdout.startswith("Usage: pax")
        assert "-h, --help" in short.stdout
    assert "--top-k TOP_K " in run_pax("decode", "-h").stdout

    script = run_pax("--show-completion", "bash")
    assert script.returncode == 0, script.stderr
    assert "_PAX_COMPLETE" in script.stdout
    pax = Path(sys.executable).with_name("pax")
    completed = subprocess.run([str(pax)], capture_output=True, text=True, timeout=60, env={
        **os.environ, "_PAX_COMPLETE": "complete_bash", "COMP_WORDS": "pax expe",
        "COMP_CWORD": "1"})
    assert completed.stdout.split() == ["experiments"], completed.stderr


def _help(columns: int) -> str:
    """``pax --help`` in a real process on a terminal this wide (typer's test runner fixes the
    width at 80)."""
    pax = Path(sys.executable).with_name("pax")
    result = subprocess.run([str(pax), "--help"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "COLUMNS": str(columns)})
    assert result.returncode == 0, result.stderr
    return result.stdout


def _command_summaries(text: str) -> dict[str, str]:
    """The Commands section of a help text: each command's summary, its wrapped lines
    joined."""
    found: dict[str, str] = {}
    name = None
    for line in text.split("Commands:\n")[1].splitlines():
        if re.match(r"  \S", line):
            name, _, rest = line.strip().partition(" ")
            found[name] = rest.strip()
        elif line.strip():
            found[name] += " " + line.strip()
    return found


def test_help_is_as_wide_as_the_terminal_with_whole_summaries(host):
    app = typer.main.get_command(build_app(host))
    expected = {name: " ".join(inspect.cleandoc(command.help).split("\n\n")[0].split())
                for name, command in app.commands.items() if not command.hidden}
    assert len(expected) > 15
    assert len(expected["eval"]) > 100  # longer than click's 45 columns
    wide = _help(220)
    lines = wide.splitlines()
    assert max(len(line) for line in lines) > 150
    for name, summary_line in expected.items():  # one line each
        assert any(re.fullmatch(rf"  {re.escape(name)} +{re.escape(summary_line)}", line)
                   for line in lines), (name, summary_line)
    narrow = _help(80)
    assert max(len(line) for line in narrow.splitlines()) <= 80
    wrapped = _command_summaries(narrow)  # wrapped, never cut (a hyphen may end a line)
    assert {n: "".join(t.split()) for n, t in wrapped.items()} == {
        n: "".join(t.split()) for n, t in expected.items()}


def test_every_option_of_every_command_has_an_upper_case_metavar(host):
    # Pax's own commands name each metavar; a plugin's are shown as pax runs them, where a
    # parameter that names none is shown by its name in capitals.
    commands = [("pax", typer.main.get_command(build_app(host)))]
    commands += [(f"pax {e.name}", as_command(e.load())) for e in host.components("commands")]
    checked = 0
    for prefix, root in commands:
        for command in walk(root):
            for param in command.params:
                if takes_metavar(param):
                    checked += 1
                    assert param.metavar and METAVAR.fullmatch(param.metavar), (
                        prefix, command.name, param.name, param.metavar)
    assert checked > 100


def _constants(host, *args):
    result = _pax(host, "config", *args, "--constants", "--format", "json")
    assert result.exit_code == 0, result.output
    return {c["name"]: c for c in json.loads(result.output)["constants"]}


@pytest.mark.parametrize("exp", ["TinyLmForTests", "MlpSynthetic"])
def test_config_constants_are_what_set_takes(host, exp):
    constants = _constants(host, "--exp", exp)
    assert all(name.isupper() for name in constants)
    assert constants["NUM_TRAIN_STEPS"]["type"] == "int"
    assert constants["LEARNING_RATE"]["type"] == "float"
    assert constants["LOGGERS"]["type"] == "tuple[str, ...]"
    # The names --set accepts: its error for an unknown one lists them all.
    refused = run_pax("config", "--exp", exp, "--set", "QQQQQQQQ=1", "--constants")
    assert refused.returncode == 2
    valid = refused.stderr.strip().split("valid names: ")[1].split(", ")
    assert sorted(constants) == sorted(valid)
    # Each value is the one in force, overrides applied.
    steps = constants["NUM_TRAIN_STEPS"]["value"] + 7
    changed = _constants(host, "--exp", exp, "--set", f"NUM_TRAIN_STEPS={steps}")
    assert changed["NUM_TRAIN_STEPS"]["value"] == steps
    assert {k: v for k, v in changed.items() if k != "NUM_TRAIN_STEPS"} == {
        k: v for k, v in constants.items() if k != "NUM_TRAIN_STEPS"}
    tsv = _pax(host, "config", "--exp", exp, "--constants", "--format", "tsv")
    header, *rows = tsv.output.splitlines()
    assert header == "constant\tvalue\ttype"
    assert [row.split("\t")[0] for row in rows] == list(constants)
    assert f"NUM_TRAIN_STEPS\t{steps - 7}\tint" in rows
    text_only = _pax(host, "config", "--exp", exp, "--format", "tsv")
    assert isinstance(text_only.exception, UsageError)
    assert str(text_only.exception).startswith("--format tsv goes with --constants")


def test_a_platform_that_is_not_here_names_the_remedy(tmp_path):
    result = run_pax("train", "--platform", "gpu", "--plugin", "testplugin", "--exp",
                     "TinyCounting", "--job-dir", str(tmp_path / "job"))
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("pax: error: --platform gpu: no gpu devices here (")
    assert "pip install -U 'jax[cuda12]'" in line and "pax-gpu" in line
    assert line.endswith("; or run on cpu here with --platform cpu")
    assert not (tmp_path / "job").exists()


def test_help_imports_no_heavy_module_and_no_plugin_command():
    """``pax --help`` lists every plugin's commands from its registrations: it imports the
    plugins' entry modules (and the catalogues they register from), nothing else of theirs,
    and none of the numerical libraries."""
    probe = textwrap.dedent("""
        import json, sys
        from pax_core.cli.main import main
        try:
            main(["--help"])
        except SystemExit as e:
            assert e.code == 0, e.code
        print(json.dumps(sorted(sys.modules)))
    """)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PAX_")}
    result = subprocess.run([sys.executable, "-c", probe], env=environ, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    modules = set(json.loads(result.stdout.splitlines()[-1]))
    heavy = {m for m in modules if m.split(".")[0] in
             ("jax", "jaxlib", "flax", "numpy", "orbax", "optax", "fiddle", "rich", "grain",
              # each a tenth of the time: the plugins' API ranges and the cache folder
              "packaging", "platformdirs")}
    assert heavy == set()
    assert "decode" in result.stdout and "transcribe" in result.stdout
    host = PluginHost()
    for record in host.records.values():
        if record.name == "core":
            continue
        package = record.module.split(".")[0]
        allowed = {package, record.module, f"{package}.experiments",
                   f"{package}.experiments.catalogue"}
        assert {m for m in modules if m.split(".")[0] == package} <= allowed, record.name


@pytest.mark.parametrize("declared", [
    ">=1.16,<2", ">= 1.16 , < 2", ">=1.0", "<1.17", "==1.17", "==1.17.0", "!=1.17", ">1.17",
    ">1.16.9", "<=1.17.0", ">=2,<3", "==1", ">=1.17.0.0"])
@pytest.mark.parametrize("version", ["1.17.0", "1.16", "2.0.0", "1.17.1", "0.9", "1.0"])
def test_a_plain_api_range_is_read_as_packaging_reads_it(declared, version):
    """``pax --help`` checks each plugin's API range without ``packaging``: the same answer."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from pax_core.plugins.versions import _plain_range_contains

    assert _plain_range_contains(declared, version) == (Version(version) in SpecifierSet(declared))


@pytest.mark.parametrize("declared", ["~=1.16", ">=1.*", "==1.17rc1", "banana"])
def test_other_api_ranges_are_left_to_packaging(declared):
    from pax_core.plugins.versions import _plain_range_contains

    assert _plain_range_contains(declared, "1.17.0") is None


def test_devices_jax_cannot_start_unasked_are_one_line_naming_a_way_out(monkeypatch):
    """No platform asked for, and JAX's own choice fails: a TPU another process holds."""
    from pax_core.run.runtime import _unavailable

    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    held = RuntimeError("Unable to initialize backend 'tpu': ABORTED: Internal error when "
                        "accessing libtpu multi-process lockfile.\nmore")
    assert _unavailable(None, None, held) == (
        "JAX could not start the devices here (Unable to initialize backend 'tpu': ABORTED: "
        "Internal error when accessing libtpu multi-process lockfile.); if another process "
        "holds the accelerator, end it, or run on the CPU with --platform cpu")
