"""The ``pax`` command.

This module imports only typer and the plugin host: ``pax --help`` and ``pax plugins`` must not
start JAX, and ``pax --help`` imports little besides typer and pluggy (``bench/cli_startup.py``
times it). Commands import the training machinery when they run; what only a failure needs is
imported when one happens.

Exit codes: 0 success; 2 a usage or configuration mistake (one line on stderr, nothing written);
1 a failure during a run; 128 + the signal (143 SIGTERM, 130 SIGINT) a run stopped on request,
its checkpoint saved. A process of a multi-process run that fails does not wait long for the
others to finish (``pax_core.parallel.processes``).
"""

# ruff: noqa: E402 (the stop requests are caught before the other imports, which take a second)
from __future__ import annotations

from pax_core.run import stop_requests

stop_requests.catch()

import signal
import sys

import typer

from pax_core.cli import app as app_module
from pax_core.cli import pax_flags
from pax_core.errors import PaxError
from pax_core.plugins.host import PluginHost, PluginSelection
from pax_core.run.logfile import report_background_failures

GLOBAL_OPTIONS = pax_flags.GLOBAL_OPTIONS


def _global_options(argv: list[str]) -> dict[str, str]:
    """Read the plugin-selection switches that precede the subcommand.

    They are needed before the app exists, because plugins contribute subcommands to it.
    """
    found: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        name, eq, value = argv[i].partition("=")
        if name in GLOBAL_OPTIONS:
            if not eq and i + 1 < len(argv):
                i += 1
                value = argv[i]
            found[name] = value
        i += 1
    return found


def _exit(code: int) -> None:
    """End the process with ``code``, without waiting long for a multi-process run's others."""
    from pax_core.parallel import processes

    processes.exit_after_failure(code)


def _stopped() -> None:
    """A stop request that ended the command before a run's loop took signals over."""
    signum = stop_requests.requested() or signal.SIGINT
    typer.echo(f"pax: stopped on request ({signal.Signals(signum).name})", err=True)
    _exit(128 + signum)


def main(argv: list[str] | None = None) -> None:
    report_background_failures()
    try:
        argv = pax_flags.translate(list(sys.argv[1:] if argv is None else argv))
        options = _global_options(argv)
        selection = PluginSelection.from_env(
            allow=options.get("--plugins"), disable=options.get("--disable-plugins")
        )
        host = PluginHost(selection)
        app = app_module.build_app(host)
        app(args=argv, prog_name="pax", obj=host)
    except KeyboardInterrupt:
        _stopped()
    except SystemExit as e:  # typer ends a KeyboardInterrupt with 130, and says nothing
        if e.code == 130 and stop_requests.requested():
            _stopped()
        raise
    except PaxError as e:
        typer.echo(f"pax: {e.label}{e}", err=True)
        _exit(e.exit_code)
    except Exception:
        import traceback

        if stop_requests.requested():  # what the interrupted code made of the request
            _stopped()
        traceback.print_exc()
        _exit(1)


if __name__ == "__main__":
    main()
