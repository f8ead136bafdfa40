"""Where the libraries' own log records go during a run: ``JOB_DIR/logs/process_N.log``.

Orbax and the other libraries built on absl log each failure of a save thread as an ERROR with
a traceback, several times over; on the console that buries the one line Pax prints about it.
For the length of a run their records (WARNING and above) are written to the job's log file
instead. The ``pax`` command also turns a background thread that dies, or a clean-up that
fails at exit, into one warning line (the traceback goes to the log file). Once a run has
failed, and said so in its one line, what its libraries' writes still in flight report as they
end (a failed save's other writes, its coroutines never awaited) goes to the log file only. For
a ``gs://`` job
the file is written locally and uploaded when the run ends (an object cannot be appended to).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import tempfile
import threading
import traceback
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

from pax_core.errors import first_line, warn
from pax_core.files import is_remote

LIBRARY_LOGGERS = ("absl",)
BACKGROUND = logging.getLogger("pax.background")
BACKGROUND.addHandler(logging.NullHandler())  # outside a run: the warning line only
BACKGROUND.propagate = False
_current: list[Any] = []
_failed: list[Any] = []  # the log files of runs that ended by an exception


class _FileHandler(logging.FileHandler):
    """A log file that never interrupts the run: when the disk is full, or the folder is gone,
    it drops records."""

    def emit(self, record: logging.LogRecord) -> None:
        # Opening the file (delayed to the first record) is outside the handler's own error
        # handling.
        with contextlib.suppress(OSError):
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        pass


@contextlib.contextmanager
def library_logs(job_dir: Any, process: int) -> Iterator[Any]:
    """Send the libraries' records and background failures to the run's log file.

    After a failure the libraries' threads may still be ending (a failed save's other writes):
    their records keep going to the file (reopened on demand) until the process exits, rather
    than to the console after the one line that reported the failure."""
    final = job_dir / "logs" / f"process_{process}.log"
    staging = Path(tempfile.mkdtemp(prefix="pax-logs-")) if is_remote(job_dir) else None
    path = staging / final.name if staging else final
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = _FileHandler(path, delay=True)
    except OSError:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    handler.setLevel(logging.WARNING)
    saved = {name: logging.getLogger(name).propagate for name in LIBRARY_LOGGERS}
    for name in (*LIBRARY_LOGGERS, BACKGROUND.name):
        logging.getLogger(name).addHandler(handler)
    for name in LIBRARY_LOGGERS:
        logging.getLogger(name).propagate = False
    _current.append(final)
    try:
        yield final
    except BaseException:
        _current.remove(final)
        _failed.append(final)
        if staging:
            _upload(path, final)
        raise  # the handlers stay, for the records of threads still ending
    _current.remove(final)
    for name, propagate in saved.items():
        logging.getLogger(name).propagate = propagate
    for name in (*LIBRARY_LOGGERS, BACKGROUND.name):
        logging.getLogger(name).removeHandler(handler)
    with contextlib.suppress(OSError):
        handler.close()
    if staging:
        _upload(path, final)
        shutil.rmtree(staging, ignore_errors=True)


def _upload(path: Path, final: Any) -> None:
    """Add a staged log file to the job's (after the earlier runs' records, as a local file
    is appended to); a failure loses only this run's records."""
    with contextlib.suppress(Exception):
        if path.exists() and path.stat().st_size:
            earlier = final.read_bytes() if final.exists() else b""
            final.write_bytes(earlier + path.read_bytes())


def report_background_failures() -> None:
    """Report a dying background thread or a failing clean-up as one warning per distinct
    failure, instead of Python's traceback on stderr; after a run failed, in its log only. A
    clean-up that fails during a run goes to its log only: it is a library's object dropped
    with its work unfinished (an asynchronous save's event loop, closed under a failed save),
    an echo of a failure reported in its own words, which would otherwise come first."""
    reported: set[str] = set()

    def report(what: str, error: BaseException | None, trace: TracebackType | None,
               once_as: str | None = None, echo: bool = False) -> None:
        if isinstance(error, KeyboardInterrupt):
            return  # a stop request that landed there (pax_core.run.stop_requests)
        line = f"{what} failed: {first_line(error, 300)}"
        if error is not None:
            details = traceback.format_exception(type(error), error, trace)
            BACKGROUND.error("%s\n%s", line, "".join(details))
        key = once_as or line
        if (_failed and not _current) or (echo and _current):
            return  # an echo of the failure the run reported, or will
        if key not in reported:
            reported.add(key)
            warn(line + (f" (details in {_current[-1]})" if _current else ""))

    class _Tasks(logging.Handler):
        """asyncio's "exception was never retrieved": the other writes of a save that failed
        (Orbax's), noticed when the process ends."""

        def emit(self, record: logging.LogRecord) -> None:
            error, trace = record.exc_info[1:] if record.exc_info else (None, None)
            report("a library's asynchronous task", error, trace, once_as="asyncio")

    tasks = logging.getLogger("asyncio")
    tasks.addHandler(_Tasks(logging.ERROR))
    tasks.propagate = False

    shown = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        """A coroutine never awaited is a write of a failed save that the ending process
        dropped (its event loop already closed); the failure itself was reported."""
        if issubclass(category, RuntimeWarning) and "was never awaited" in str(message):
            BACKGROUND.warning("%s", message)
        else:
            shown(message, category, *args, **kwargs)

    warnings.showwarning = show

    threading.excepthook = lambda a: report(
        f"a background thread ({a.thread.name if a.thread else 'unnamed'})", a.exc_value,
        a.exc_traceback)
    sys.unraisablehook = lambda u: report(
        f"a clean-up ({u.err_msg or 'at exit'})", u.exc_value, u.exc_traceback, echo=True)
