"""Sessions: `tests` (CI), `tests_newest` (Python 3.12, newest jax), `lint`, `bench`."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.reuse_existing_virtualenvs = True

PACKAGES = ["-e", ".[test]", "-e", "plugins/pax_transformer", "-e", "pax_lm[corpus]",
            "-e", "tests/plugins/pax_testplugin"]


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
    session.install(*PACKAGES)
    session.run("pytest", "-q", *session.posargs,
                env={"PAX_STRICT_PLUGINS": os.environ.get("PAX_STRICT_PLUGINS", "1")})


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite on this interpreter (CPU, 8 fake devices)."""
    _pytest(session)


@nox.session(python=_interpreter("3.12"))
def tests_newest(session: nox.Session) -> None:
    """The test suite on Python 3.12 with the newest jax and flax."""
    session.install("--upgrade", "jax", "flax")
    _pytest(session)


@nox.session
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.17,<0.18")
    session.run("ruff", "check", ".")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks (about 5 minutes): CLI start-up, and `pax train` against a bare loop;
    results under bench/results/. Arguments go to bench/train_speed.py."""
    session.install(*PACKAGES)
    session.run("python", "bench/cli_startup.py")
    session.run("python", "bench/train_speed.py", *session.posargs)
