"""The interface every metric sink implements, and the group the training loop talks to.

The loop calls loggers only with host-side Python values, at summary steps and after evals, so a
logger never causes a device sync. ``progress`` is called every step with the step number only
(no device values) so that a progress bar can move without reading the device.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

from pax_core.errors import RunError, warn
from pax_core.files import storage_failure


def watched_metric(hparams: Mapping[str, Any]) -> tuple[str, str] | None:
    """The eval metric a run watches, as (kind, name), from its settings' ``eval_metric``
    (``"eval/test accuracy"``: ``task.train.eval_metric`` of the first eval dataset), or None
    for a run without one."""
    watched = hparams.get("eval_metric")
    if not isinstance(watched, str) or " " not in watched:
        return None
    kind, name = watched.split(" ", 1)
    return kind, name


class Logger(abc.ABC):
    """A metric sink. Construct with ``Logger(job_dir)``; all methods run on process 0 only."""

    def __init__(self, job_dir: str):
        self.job_dir = job_dir

    def start(self, *, experiment: str, start_step: int, num_train_steps: int,
              hparams: Mapping[str, Any]) -> None:
        """Called once before the first step. ``hparams`` are flat scalar settings of the run."""

    def progress(self, step: int) -> None:
        """Called after every step is dispatched; must be cheap."""

    @abc.abstractmethod
    def write(self, step: int, kind: str, metrics: Mapping[str, float]) -> None:
        """Record ``metrics`` at ``step``. ``kind`` is ``train`` or ``eval/<dataset name>``."""

    def text(self, step: int, tag: str, text: str) -> None:
        """Record a piece of text (a config dump, a sample); optional."""

    def finish(self, status: str) -> None:
        """How the training ended, once, just before ``close``: ``completed``,
        ``interrupted`` (stopped on request, to be resumed) or ``failed``; optional (a logger
        whose record has a status: a tracking service's run)."""

    def close(self) -> None:
        """Flush and release files; called once at the end, also after a failure."""


class LoggerGroup:
    """Fans calls out to several loggers; one that fails is reported once and dropped.

    A logger that fails on its storage (a full disk, a vanished job directory) stops the run
    instead, in one line: the other loggers and the next checkpoint are written to the same
    storage, and a run that went on would lose its metrics unseen. The loggers are dropped
    then, unclosed: closing would only fail again on the same storage."""

    def __init__(self, loggers: Sequence[Logger]):
        self.loggers = list(loggers)

    def _each(self, method: str, *args: Any, **kwargs: Any) -> None:
        for logger in list(self.loggers):
            try:
                getattr(logger, method)(*args, **kwargs)
            except Exception as e:
                found = storage_failure(e)
                if found is not None and method != "close":  # close may run under another error
                    self.loggers = []
                    raise RunError(f"the metrics could not be written to {logger.job_dir} "
                                   f"({found[0]}): {found[1]}, then run the same command to "
                                   f"resume from the newest complete checkpoint") from e
                if method == "finish":  # still closed, to release what it holds
                    warn(f"logger {type(logger).__name__} failed in finish: "
                         f"{type(e).__name__}: {e}")
                    continue
                warn(f"logger {type(logger).__name__} failed in {method} and is switched off: "
                     f"{type(e).__name__}: {e}")
                self.loggers.remove(logger)

    def start(self, **kwargs: Any) -> None:
        self._each("start", **kwargs)

    def progress(self, step: int) -> None:
        self._each("progress", step)

    def write(self, step: int, kind: str, metrics: Mapping[str, float]) -> None:
        self._each("write", step, kind, metrics)

    def text(self, step: int, tag: str, text: str) -> None:
        self._each("text", step, tag, text)

    def finish(self, status: str) -> None:
        self._each("finish", status)

    def close(self) -> None:
        self._each("close")
