"""The fork server of ``pax_core.testing.forked``: a process that imports Pax and the installed
plugins once, then forks a child for each ``pax`` command asked of it.

It reads requests, one JSON object a line on standard input (``id``, ``command``, ``env``,
``cwd``, ``stdout``, ``stderr``), and answers on standard output with ``{"id", "pid"}`` once a
child is forked and ``{"pid", "code"}`` once it ends (``code`` as ``subprocess`` gives it:
negative for the signal that ended it). It forks with one thread and no JAX backend: a child
forked from a process with threads may inherit a lock no thread will release, and each child
starts its own backend for its own devices. At the end of its input it kills the children
still running, so none outlives the tests that started it.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import importlib.metadata
import json
import os
import select
import signal
import sys
import traceback
from typing import IO, Any

from pax_core.plugins.hookspecs import PROJECT

# What a forked `pax train` would otherwise import itself: the command line, a training run's
# modules, and every installed plugin's module.
MODULES = ("pax_core.cli.main", "pax_core.cli.app", "pax_core.commands.jobs",
           "pax_core.run.loop", "pax_core.loggers.tensorboard", "orbax.checkpoint")


def _preload() -> None:
    names = [*MODULES, *(ep.module for ep in importlib.metadata.entry_points(group=PROJECT))]
    for name in names:
        # A module that fails here fails again in the command that needs it, which reports it.
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _child(request: dict[str, Any], closing: list[int]) -> None:
    """Become the command: its environment, directory, output files and signals, then
    ``pax``'s entry point; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in closing:
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        out = os.open(request["stdout"], os.O_WRONLY | os.O_APPEND)
        err = (out if request["stderr"] == request["stdout"]
               else os.open(request["stderr"], os.O_WRONLY | os.O_APPEND))
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        sys.argv = list(request["command"])
        code = _main(request["command"][1:])
    except BaseException:  # the child's own error (its directory gone, say): said, exit 1
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _main(args: list[str]) -> int:
    """``pax ARGS`` to its end, and the exit status an interpreter would end with."""
    from pax_core.cli.main import main

    try:
        main(args)
        code: Any = 0
    except SystemExit as e:
        code = e.code
    atexit._run_exitfuncs()
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def _answer(channel: IO[str], message: dict[str, Any]) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def serve() -> None:
    channel = os.fdopen(os.dup(1), "w")  # the answers; stray prints go nowhere
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    _preload()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    running: set[int] = set()
    pending = b""
    while True:
        ready, _, _ = select.select([0, wake_read], [], [])
        if wake_read in ready:
            os.read(wake_read, 4096)
        while running:  # children that ended
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            running.discard(pid)
            _answer(channel, {"pid": pid, "code": os.waitstatus_to_exitcode(status)})
        if 0 not in ready:
            continue
        data = os.read(0, 1 << 16)
        if not data:  # the tests are done
            for pid in running:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return
        pending += data
        *lines, pending = pending.split(b"\n")  # a read may end inside a line
        for line in lines:
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _child(request, [wake_read, wake_write, channel.fileno()])
            running.add(pid)
            _answer(channel, {"id": request["id"], "pid": pid})


if __name__ == "__main__":
    serve()
