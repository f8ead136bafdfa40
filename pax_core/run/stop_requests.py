"""Stop requests (Ctrl-C, SIGTERM) that arrive before a run's loop takes them over.

Left to Python, a Ctrl-C in the first seconds of a command becomes a ``KeyboardInterrupt``
wherever the program happens to be: inside an import, whose C extension prints a traceback (or
jaxlib's, which turns it into an ``ImportError``), or inside a clean-up, which swallows it, and
the run then trains to its last step; and SIGTERM ends the process without a word. ``pax``
installs ``catch`` before anything else: every request is remembered and raised as a
``KeyboardInterrupt``, but never inside an import (it is delivered again a moment later, until
the import is done), and ``pax`` reports it in one line with the signal's exit status. The
training loop, once it takes signals over, starts from a request that got lost on the way
(``requested``) and stops at once, its checkpoint saved.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType

_received: list[int] = []
_again: list[bool] = [False]  # the next delivery is ours, of a request already received
_AGAIN_SEC = 0.1


def _importing(frame: FrameType | None) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _request(signum: int, frame: FrameType | None) -> None:
    if _again[0]:
        _again[0] = False
    else:
        _received.append(signum)
    if _importing(frame):
        _again[0] = True
        later = threading.Timer(_AGAIN_SEC, os.kill, (os.getpid(), signum))
        later.daemon = True
        later.start()
        return
    raise KeyboardInterrupt


def catch() -> None:
    """Handle SIGINT and SIGTERM as stop requests from now on, also where the process was
    started with SIGINT ignored (a background job of a script): a request sent to ``pax`` is
    meant for it.

    Not in a process that ``multiprocessing`` started by importing the ``pax`` script again (a
    worker of ``pax data prepare``): its parent stops it, with SIGTERM's default action, even
    while the worker is blocked in a C library's write, where no Python handler would run."""
    if "__mp_main__" in sys.modules:
        return
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _request)


def requested() -> int:
    """The signal of the first stop request received so far, or 0."""
    return _received[0] if _received else 0
