"""``pax`` commands in processes forked from one that imported Pax once.

Why: a test suite runs ``pax`` hundreds of times, and a new interpreter spends seconds importing
JAX, Flax, Optax, Orbax and the plugins before the command starts; a kill trial would spend most
of its time there. A fork server (``pax_core.testing.fork_server``, one for each test process,
started on first use) imports them once, and each command is a child forked from it: a process
of its own, with its own environment, working directory, devices (``XLA_FLAGS`` is read when
the child starts its backend), output, exit status and signals, as ``pax`` run from a shell
has. What it skips is the interpreter's start and the console script's two lines.

The interpreter reads its ``PYTHON*`` variables (``PYTHONPATH``: where plugins are found) when
it starts and JAX its ``JAX_*`` ones when it is imported, so a command whose variables of these
two kinds differ from the server's runs in a new interpreter instead.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def pax_program() -> str:
    """The ``pax`` console script beside this interpreter."""
    return str(Path(sys.executable).with_name("pax"))


def _start_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables the interpreter reads when it starts and JAX when it is imported."""
    return {k: v for k, v in env.items() if k.startswith(("PYTHON", "JAX_"))}


class _Server:
    """The fork server and what it said: the pid of each request, the exit status of each
    child that ended."""

    def __init__(self) -> None:
        self.start_env = _start_env(os.environ)
        self.process = subprocess.Popen([sys.executable, "-m", "pax_core.testing.fork_server"],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.ids = itertools.count()
        self.pids: dict[int, int] = {}
        self.codes: dict[int, int] = {}
        self.changed = threading.Condition()  # an answer arrived
        self.writing = threading.Lock()  # one request at a time on the server's input
        threading.Thread(target=self._listen, daemon=True, name="pax-fork-server").start()

    def _listen(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            with self.changed:
                if "id" in message:  # said before the child's end: a pid used before is new
                    self.pids[message["id"]] = message["pid"]
                    self.codes.pop(message["pid"], None)
                else:
                    self.codes[message["pid"]] = message["code"]
                self.changed.notify_all()
        with self.changed:  # the server is gone: nothing more will be answered
            self.changed.notify_all()

    def fork(self, request: dict[str, Any]) -> int:
        assert self.process.stdin is not None
        with self.writing:  # not under `changed`: the listener must go on reading meanwhile
            request_id = next(self.ids)
            self.process.stdin.write((json.dumps({**request, "id": request_id}) + "\n").encode())
            self.process.stdin.flush()
        with self.changed:
            if not self.changed.wait_for(lambda: request_id in self.pids
                                         or self.process.poll() is not None, timeout=120):
                raise RuntimeError("the fork server did not answer in 120 s")
            if request_id not in self.pids:
                raise RuntimeError(f"the fork server ended (exit status {self.process.poll()})")
            return self.pids.pop(request_id)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        with self.changed:
            self.changed.wait_for(lambda: pid in self.codes or self.process.poll() is not None,
                                  timeout=timeout)
            return self.codes.pop(pid, None)


_server: _Server | None = None
_server_lock = threading.Lock()


def _the_server() -> _Server:
    global _server
    with _server_lock:
        if _server is None or _server.process.poll() is not None:
            _server = _Server()
        return _server


class ForkedCommand:
    """A ``pax`` command running in a forked child; the part of ``subprocess.Popen``'s face
    that tests use (``args``, ``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``,
    ``returncode``: negative for the signal that ended it)."""

    def __init__(self, server: _Server, pid: int, args: list[str]) -> None:
        self._server = server
        self.args = args
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self._wait(0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._wait(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def _wait(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            self.returncode = self._server.wait(self.pid, timeout)
            if self.returncode is None and self._server.process.poll() is not None:
                raise RuntimeError(f"the fork server ended before {self.args[:2]} did")
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_command(args: Sequence[str], *, stdout: Path, stderr: Path,
                  env: Mapping[str, str] | None = None) -> ForkedCommand | subprocess.Popen:
    """Start ``pax ARGS`` with ``env`` (this process's environment by default) in this
    process's working directory, its output written to the files ``stdout`` and ``stderr``
    (one file for both where they are the same path); forked where ``env``'s variables read at
    start are the server's, else in a new interpreter."""
    env = dict(os.environ if env is None else env)
    command = [pax_program(), *args]
    for path in {Path(stdout), Path(stderr)}:  # there, even for a command killed at once
        path.write_bytes(b"")
    server = _the_server()
    if _start_env(env) != server.start_env:
        with open(stdout, "w") as out, (open(stderr, "w") if stderr != stdout
                                        else contextlib.nullcontext(out)) as err:
            return subprocess.Popen(command, stdout=out, stderr=err, env=env)
    pid = server.fork({"command": command, "env": env, "cwd": os.getcwd(),
                       "stdout": str(stdout), "stderr": str(stderr)})
    return ForkedCommand(server, pid, command)


def run_command(args: Sequence[str], *, env: Mapping[str, str] | None = None,
                timeout: float | None = None) -> subprocess.CompletedProcess:
    """``pax ARGS`` to its end, as ``subprocess.run(..., capture_output=True, text=True)``
    returns it (``subprocess.TimeoutExpired``, the command killed, past ``timeout``)."""
    with tempfile.TemporaryDirectory(prefix="pax-command-") as folder:
        out, err = Path(folder) / "stdout", Path(folder) / "stderr"
        command = start_command(args, stdout=out, stderr=err, env=env)
        try:
            command.wait(timeout)
        except subprocess.TimeoutExpired:
            command.kill()
            command.wait()
            raise
        return subprocess.CompletedProcess([pax_program(), *args], command.returncode,
                                           out.read_text(errors="replace"),
                                           err.read_text(errors="replace"))
