"""Sessions: `tests`, `plugin_kit`, `seqio`, `ray`, `loggers`, `sweep`, `hf` and `paxml` (CI),
`soak` (the fault trials at full count), `test_times` (CI's time, session by session and test
by test), `tests_newest` (Python 3.12, newest jax), `lint`, `bench`, `docs` (the documentation
site), `notebooks` (docs/notebooks run on a Jupyter kernel).

Environments are made and filled by uv (`pip install nox uv`), which installs this repository's
packages in seconds where pip takes a minute."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import shutil
import subprocess
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
# Python writes the bytecode of what it imports, whatever the machine's default: the suite starts
# hundreds of interpreters that import JAX, Flax, Orbax and the plugins, and without the cached
# bytecode each compiles their source again (seconds of CPU each).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "uv"

# The repository's packages (pyproject.toml's [tool.pax]); the `tests` session installs those
# without a session of their own.
ALL_PACKAGES = tomllib.loads(Path("pyproject.toml").read_text())["tool"]["pax"]["packages"]
PACKAGES = [arg for p in ALL_PACKAGES if p.get("session", "tests") == "tests"
            for arg in ("-e", p["install"])]


def _own(session: str) -> list[str]:
    """``-e`` and the installation of the packages tested in ``session`` alone."""
    return [arg for p in ALL_PACKAGES if p.get("session") == session
            for arg in ("-e", p["install"])]


def _own_tests(session: str) -> list[str]:
    """The tests of the packages tested in ``session`` alone."""
    return [p["tests"] for p in ALL_PACKAGES if p.get("session") == session]

BENCH_PACKAGES = [".", "./plugins/pax_transformer", "./plugins/pax_pipeline", "./pax_lm[corpus]"]


def _interpreter(version: str) -> str | None:
    """``pythonX.Y`` from PATH if it runs, else from a pyenv installation, else None."""
    name = f"python{version}"
    runs = shutil.which(name) and subprocess.run([name, "--version"], capture_output=True)
    if runs and runs.returncode == 0:
        return name
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = sorted(glob.glob(f"{root}/versions/{version}*/bin/{name}"))
    return found[-1] if found else None


def _pytest(session: nox.Session) -> None:
    """Every core runs test files side by side (a file's tests stay on one worker, so its
    module fixtures are built once), handed out longest first (the order conftest.py gives);
    then the tests that time signals against a running job run alone, since a loaded machine
    delays their processes past what they measure. Each run is held to its time budget
    (``PAX_TEST_BUDGET``: the repository's conftest.py)."""
    session.install(*PACKAGES)
    env = {"PAX_STRICT_PLUGINS": os.environ.get("PAX_STRICT_PLUGINS", "1"),
           "PAX_TEST_BUDGET": "1"}
    session.run("pytest", "-q", "-n", "auto", "--dist", "loadfile", "--no-loadscope-reorder",
                "-m", "not serial", *session.posargs, env=env)
    session.run("pytest", "-q", "-m", "serial", *session.posargs, env=env,
                success_codes=[0, 5])  # 5: posargs chose no serial test


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite on this interpreter (CPU, 8 fake devices)."""
    _pytest(session)


@nox.session(python=_interpreter("3.12"))
def tests_newest(session: nox.Session) -> None:
    """The test suite on Python 3.12 with the newest jax and flax."""
    session.install("--upgrade", "jax", "flax")
    _pytest(session)


def _fresh_venv(session: nox.Session, where: str, *requirements: str,
                find_links: str) -> str:
    """A new virtual environment with ``requirements`` installed from wheels in ``find_links``
    (and their dependencies from the package index), nothing of this checkout; returns its bin
    folder."""
    session.run("uv", "venv", "-q", where, external=True)
    session.run("uv", "pip", "install", "-q", "--python", os.path.join(where, "bin", "python"),
                "--find-links", find_links, *requirements, external=True)
    return os.path.join(where, "bin")


@contextlib.contextmanager
def _installing() -> Iterator[None]:
    """One session at a time installs from this checkout: .ci/run runs sessions side by side,
    and building a package of the checkout writes in its folders (egg-info, build/)."""
    os.makedirs(".nox", exist_ok=True)
    with open(os.path.join(".nox", "install.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _pip_check(session: nox.Session) -> None:
    """The session's environment holds no broken or conflicting requirement."""
    session.run("uv", "pip", "check", "-q", external=True)


@nox.session
def plugin_kit(session: nox.Session) -> None:
    """What a plugin author and a user see: `pax plugins new` renders a plugin; wheels of
    pax-core and the plugin install into a fresh venv, as `pip install` of a published plugin
    would; the plugin's tests and `pax train` run there. Then pax-lm is installed from wheels
    alone (pax-core, pax-transformer, pax-lm) into another fresh venv and trains."""
    tmp = session.create_tmp()
    shutil.rmtree(tmp)
    os.makedirs(tmp)
    wheels, plugin = os.path.join(tmp, "wheels"), os.path.join(tmp, "pax_kitdemo")
    with _installing():
        session.install(".")
        session.run("pax", "plugins", "new", "kitdemo", "--backend", "--output", plugin)
        for source in (".", plugin, "./plugins/pax_transformer", "./pax_lm"):
            session.run("uv", "build", "-q", "--wheel", "--out-dir", wheels, source,
                        external=True)
        for package in (".", "plugins/pax_transformer", "pax_lm"):  # setuptools' build/
            shutil.rmtree(os.path.join(package, "build"), ignore_errors=True)
    for wheel in glob.glob(os.path.join(wheels, "*.whl")):
        with zipfile.ZipFile(wheel) as contents:
            if not any(n.endswith(".dist-info/licenses/LICENSE") for n in contents.namelist()):
                session.error(f"{wheel} holds no license text (LICENSE beside its pyproject.toml)")
    env = {"PAX_STRICT_PLUGINS": "1"}
    author = _fresh_venv(session, os.path.join(tmp, "author"), "pax-kitdemo[test]",
                         find_links=wheels)
    session.run(f"{author}/pax", "plugins", external=True, env=env)
    session.run(f"{author}/pytest", "-q", "-p", "no:cacheprovider", os.path.join(plugin, "tests"),
                external=True, env=env)
    session.run(f"{author}/pax", "train", "--plugin", "kitdemo", "--exp", "KitdemoSine",
                "--job-dir", os.path.join(tmp, "kitdemo_job"), external=True, env=env)
    user = _fresh_venv(session, os.path.join(tmp, "user"), "pax-lm[corpus]", find_links=wheels)
    session.run(f"{user}/pax", "plugins", external=True, env=env)
    session.run(f"{user}/pax", "train", "--plugin", "lm", "--exp", "TinyLmForTests",
                "--job-dir", os.path.join(tmp, "lm_job"), "--set", "NUM_TRAIN_STEPS=20",
                external=True, env=env)


@nox.session
def seqio(session: nox.Session) -> None:
    """pax-seqio in an environment of its own, since SeqIO pulls TensorFlow: its tests,
    including a `pax train` of pax-lm's tiny model on a SeqIO task (about 4 minutes on 2 cores,
    the installation included). No other session installs pax-seqio."""
    with _installing():
        session.install("-e", ".[test]", "-e", "plugins/pax_transformer", "-e", "pax_lm",
                        *_own("seqio"))
    _pip_check(session)
    session.run("pytest", "-q", "-p", "no:cacheprovider", "--confcutdir", ".",
                *_own_tests("seqio"),
                *session.posargs,
                env={"PAX_STRICT_PLUGINS": os.environ.get("PAX_STRICT_PLUGINS", "1")})


@nox.session
def ray(session: nox.Session) -> None:
    """pax-ray in an environment of its own, since Ray is large: its tests start a one-node
    Ray cluster on 127.0.0.1 and sweep through it (about 3 minutes on 2 cores, the
    installation included). No other session installs pax-ray."""
    with _installing():
        session.install("-e", ".[test]", "-e", "plugins/pax_sweep", *_own("ray"))
    _pip_check(session)
    session.run("pytest", "-q", "-p", "no:cacheprovider", "--confcutdir", ".",
                *_own_tests("ray"),
                *session.posargs,
                env={"PAX_STRICT_PLUGINS": os.environ.get("PAX_STRICT_PLUGINS", "1")})


@nox.session
def loggers(session: nox.Session) -> None:
    """pax-wandb and pax-mlflow in an environment of their own, since W&B's SDK and MLflow
    (whose tracking server the tests start on 127.0.0.1) are large: each plugin's tests train
    small jobs with its logger, W&B's offline and read back from the run's files, MLflow's
    through the server (about 3 minutes on 2 cores, the installation included). No other
    session installs them."""
    with _installing():
        session.install("-e", ".[test]", *_own("loggers"))
    _pip_check(session)
    # The two plugins' test files side by side: a file's tests share one trained job (and
    # pax-mlflow's one server), so each file stays on one worker.
    session.run("pytest", "-q", "-p", "no:cacheprovider", "--confcutdir", ".",
                "-n", "auto", "--dist", "loadfile", *_own_tests("loggers"), *session.posargs,
                env={"PAX_STRICT_PLUGINS": os.environ.get("PAX_STRICT_PLUGINS", "1")})


# torch for CPU, from a local wheel folder where the machine keeps one (PyPI's Linux wheel of
# torch pulls the CUDA libraries, gigabytes a CPU test does not use).
TORCH_WHEELS = os.environ.get("PAX_TORCH_WHEELS", "/opt/wheels")
HF_TEST_REQUIREMENTS = ("torch>=2.4,<3", "transformers>=4.56,<6", "sentencepiece>=0.2,<0.3",
                        "peft>=0.17,<1")


@nox.session
def hf(session: nox.Session) -> None:
    """Hugging Face interchange against transformers itself: tiny random models of every open
    family built and saved by transformers, imported (`pax import hf`), their logits and greedy
    tokens compared, exported (`pax export --format hf`) and loaded by `from_pretrained`, and
    trained adapters exported merged and as PEFT's folder (peft); and `pax eval --harness`
    through lm-eval (pax-lm's `harness` extra) on tasks the tests write. torch, transformers,
    peft and lm-eval are installed here alone: no package of the repository depends on them."""
    links = ["--find-links", TORCH_WHEELS] if os.path.isdir(TORCH_WHEELS) else []
    with _installing():
        session.install(*links, "-e", ".[test]", "-e", "plugins/pax_transformer",
                        "-e", "pax_lm[corpus,harness]", *HF_TEST_REQUIREMENTS)
    _pip_check(session)
    # Independent tests: spread test by test over the cores, but a file that trains one job
    # for all its tests keeps them on one worker (its xdist_group), so it trains once.
    session.run("pytest", "-q", "-p", "no:cacheprovider", "--confcutdir", ".", "-n", "auto",
                "--dist", "loadgroup", "pax_lm/tests_hf", *session.posargs,
                env={"PAX_STRICT_PLUGINS": os.environ.get("PAX_STRICT_PLUGINS", "1")})


# paxml and praxis 1.4 as their last release installs: they pin jax 0.4.26 but not its jaxlib,
# and tensorflow-hub's newest release imports pkg_resources, which setuptools 70 dropped.
PAXML_REQUIREMENTS = ("paxml==1.4.0", "praxis==1.4.0", "jaxlib==0.4.26", "setuptools<70",
                      "tensorflow-hub==0.12.0")


@nox.session
def paxml(session: nox.Session) -> None:
    """`pax import paxml` against paxml itself: paxml 1.4 (which needs Python 3.10: found on
    PATH or in pyenv, else downloaded by uv; the session is skipped, saying so, where none can
    be had) installs into an environment of its own, trains three tiny praxis LMs
    there for 40 steps and writes their logits; this session's environment imports each
    checkpoint into Pax's catalogue experiment and compares (about 3 minutes on 2 cores, the
    installation included)."""
    where = os.path.join(session.create_tmp(), "paxml_venv")
    shutil.rmtree(where, ignore_errors=True)
    python310 = _interpreter("3.10")
    if python310 is not None:
        session.run("uv", "venv", "-q", "--python", python310, where, external=True)
    else:  # one uv downloads (its managed Pythons), or the session is skipped saying why
        made = subprocess.run(["uv", "venv", "-q", "--python", "3.10", where],
                              capture_output=True, text=True)
        if made.returncode != 0:
            why = (made.stderr.strip().splitlines() or ["no reason given"])[-1]
            session.skip(f"paxml 1.4 installs on Python 3.10 only: none is on PATH or in "
                         f"pyenv, and uv could not download one ({why}); `uv python install "
                         f"3.10`, then run again")
    paxml_python = os.path.join(where, "bin", "python")
    session.run("uv", "pip", "install", "-q", "--python", paxml_python, *PAXML_REQUIREMENTS,
                external=True)
    with _installing():
        session.install("-e", ".[test]", "-e", "plugins/pax_transformer", "-e", "pax_lm")
    _pip_check(session)
    # One process: paxml trains the checkpoints once for the run (a session fixture).
    session.run("pytest", "-q", "-p", "no:cacheprovider", "--confcutdir", ".",
                "pax_lm/tests_paxml", *session.posargs,
                env={"PAX_STRICT_PLUGINS": os.environ.get("PAX_STRICT_PLUGINS", "1"),
                     "PAXML_PYTHON": paxml_python})


# The repository's tiny plugin, whose experiments some sessions' tests sweep or train.
TEST_PLUGIN = "tests/plugins/pax_testplugin"
# What pax-sweep brings that pax-core alone must not.
SWEEP_ONLY = ("pyglove", "matplotlib")
ABSENT = ("import importlib.util, sys; found = [m for m in sys.argv[1:] if "
          "importlib.util.find_spec(m)]; sys.exit(f'pax-core alone installs {found}' if found "
          "else 0)")


@nox.session(venv_backend="none")
def sweep(session: nox.Session) -> None:
    """pax-sweep as a user meets it, in a new virtual environment: pax-core alone first, which
    must bring neither PyGlove nor matplotlib; then pax-sweep with OSS Vizier (large) into the
    same environment (with the test plugin, whose experiment some of them sweep), and its tests
    there, `pax sweep` end to end with every algorithm (about 5 minutes on 2 cores, the
    installation included). No other session installs pax-sweep but
    pax-ray's (and bench's, in an environment of its own)."""
    where = os.path.join(session.create_tmp(), "sweep_venv")
    shutil.rmtree(where, ignore_errors=True)
    session.run("uv", "venv", "-q", where, external=True)
    python = os.path.join(where, "bin", "python")
    install = ["uv", "pip", "install", "-q", "--python", python]
    with _installing():
        session.run(*install, "-e", ".", external=True)
    session.run(python, "-c", ABSENT, *SWEEP_ONLY, external=True)
    with _installing():
        session.run(*install, "-e", ".[test]", *_own("sweep"), "-e", TEST_PLUGIN,
                    external=True)
    session.run("uv", "pip", "check", "-q", "--python", python, external=True)
    # Independent tests, most of their time in a few files' sweeps: spread test by test.
    session.run(python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--confcutdir", ".",
                "-n", "auto", "--dist", "load", *_own_tests("sweep"), *session.posargs,
                external=True,
                env={"PAX_STRICT_PLUGINS": os.environ.get("PAX_STRICT_PLUGINS", "1")})


# The tests whose properties need many repetitions: kill -9 at random moments (their trial
# counts come from pax_core.testing.fault_trials) and storage that fails under a run.
SOAK_TESTS = ["tests/test_kill_trials.py", "pax_lm/tests/test_lm_kill_trials.py",
              "tests/test_remote_jobdir.py::test_a_gs_job_killed_at_random_moments_resumes_bitwise"]
STORAGE_FAULT_TESTS = "tests/test_storage_faults.py"
STORAGE_FAULT_REPEATS = "20"


@nox.session
def soak(session: nox.Session) -> None:
    """The fault trials at full count, on demand (about 30 minutes on 2 cores): CI runs a
    fixed, seeded sample of each; here the kill -9 tests run their soak counts (160 runs killed
    mid-run: 100 of the core's MLP, 40 of the tiny LM, 20 in a bucket; a run that ends before
    its kill is run again with an earlier one, not counted) and each storage fault runs 20
    times in a row, stopping at the first failure."""
    session.install(*PACKAGES, "pytest-repeat>=0.9.4,<0.10")
    env = {"PAX_STRICT_PLUGINS": "1", "PAX_SOAK": "1"}
    session.run("pytest", "-q", "-s", *SOAK_TESTS, *session.posargs, env=env)
    session.run("pytest", "-q", "-x", "--count", STORAGE_FAULT_REPEATS, STORAGE_FAULT_TESTS,
                *session.posargs, env=env)


@nox.session(venv_backend="none")
def test_times(session: nox.Session) -> None:
    """CI's time, measured: a clean clone of this checkout's HEAD runs .ci/run, every session
    and every test timed; writes bench/results/test_times.{json,md}."""
    session.run("python3", "bench/test_times.py", *session.posargs, external=True)


# What the site documents: the packages whose commands the command-line reference lists (pax-seqio
# and pax-ray add none, and their API pages are read from the source, so neither TensorFlow nor
# Ray is installed here).
DOCS_PACKAGES = [".", "plugins/pax_transformer", "plugins/pax_pipeline", "plugins/pax_multislice",
                 "plugins/pax_gpu", "pax_lm", "pax_vision", "pax_speech", "plugins/pax_sweep"]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (mkdocs.yml): built with --strict, so a broken link, an anchor
    that is not there or an unresolved API reference fails it, into site/; then opened in a
    headless Chromium (docs_tools/test_site.py), every page checked for its content and
    navigation and three of them photographed into the session's tmp/screenshots. Chromium is
    Debian's `chromium`: installed here with apt-get where it is missing and this runs as root
    (as CI does); where it cannot be had, the pages are not opened and the session is skipped
    after the build, naming the package to install."""
    with _installing():
        session.install(*[arg for p in DOCS_PACKAGES for arg in ("-e", p)],
                        "-r", "docs_tools/requirements.txt", "pytest>=9,<10")
    _pip_check(session)
    if _chromium() is None and os.geteuid() == 0 and shutil.which("apt-get"):
        for apt in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
            subprocess.run(apt, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    # NO_MKDOCS_2_WARNING: Material's banner about MkDocs 2, which these pins do not install.
    session.run("mkdocs", "build", "--strict", "--clean",
                env={"PAX_STRICT_PLUGINS": "1", "NO_MKDOCS_2_WARNING": "1"})
    if _chromium() is None:
        session.skip("the site is built; its pages are opened in a headless Chromium, and none "
                     "is installed: apt-get install -y chromium (Debian's package), then run "
                     "again")
    screenshots = os.path.join(session.create_tmp(), "screenshots")
    session.run("pytest", "-q", "-p", "no:cacheprovider", "--confcutdir", "docs_tools",
                "docs_tools/test_site.py", *session.posargs,
                env={"PAX_SITE_DIR": "site", "PAX_SCREENSHOTS": screenshots})


# The notebooks' runner: nbclient drives a kernel of ipykernel in the session's environment.
NOTEBOOK_REQUIREMENTS = ("nbclient>=0.11,<0.12", "nbformat>=5.10,<6", "ipykernel>=7,<8",
                         "jupyter-client>=8.6,<9", "pytest>=9,<10")


@nox.session
def notebooks(session: nox.Session) -> None:
    """The notebooks in docs/notebooks (the quick start, an experiment and a plugin of one's
    own, from Python) run top to bottom on a real Jupyter kernel of this environment, each
    failing on any cell's error with its traceback, and are checked to be committed without
    outputs. Installed as a user of the LM quick start installs Pax, with matplotlib."""
    with _installing():
        session.install("-e", ".[plot]", "-e", "plugins/pax_transformer", "-e",
                        "pax_lm[corpus]", *NOTEBOOK_REQUIREMENTS)
    _pip_check(session)
    session.run("pytest", "-q", "-p", "no:cacheprovider", "--confcutdir", ".", "docs/notebooks",
                *session.posargs,
                env={"PAX_STRICT_PLUGINS": os.environ.get("PAX_STRICT_PLUGINS", "1")})


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.17,<0.18")
    session.run("ruff", "check", ".")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks (about an hour on 2 cores), each writing bench/results/NAME.{json,md}
    with the commit, date and command it was measured at: CLI start-up and its imports by
    package, `pax train` against hand-written flax + optax and a bare loop around Pax's model
    (speed, start-up, memory), Pax's compiled step against the bare one (matrix products, FLOP
    and byte counts), compiling's phases and memory with and without the freed heap given back,
    a pipeline's step time and gradients against the unpipelined model's, and a `pax sweep`;
    then the documentation's tables are generated from the results (bench/doc_tables.py).
    Arguments go to bench/train_speed.py (`--models quickstart --rounds 2` takes 3 minutes).
    Installed as an LM user installs Pax, without the test extras and the other plugins, whose
    imports and registrations a user's `pax train` would not pay for; the sweep runs in an
    environment of its own, with pax-sweep."""
    session.install(*BENCH_PACKAGES)
    session.run("python", "bench/cli_startup.py")
    session.run("python", "bench/import_time.py")
    session.run("python", "bench/train_speed.py", *session.posargs)
    for script in ("step_hlo", "compile_memory", "pipeline_speed", "pipeline_grads"):
        session.run("python", f"bench/{script}.py")
    where = os.path.join(session.create_tmp(), "sweep_venv")
    shutil.rmtree(where, ignore_errors=True)
    session.run("uv", "venv", "-q", where, external=True)
    python = os.path.join(where, "bin", "python")
    session.run("uv", "pip", "install", "-q", "--python", python, "-e", ".", "-e",
                "./plugins/pax_sweep", external=True)
    session.run(python, "bench/sweep_trials.py", external=True)
    session.run("python", "bench/doc_tables.py")
