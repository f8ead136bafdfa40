"""The thread that talks to MLflow's tracking server for a logger, so the loop never waits on it.

The logger hands it work and returns at once: the run to open, params, metric values, the run's
end. The thread does the work in that order, metric values in requests of up to 1,000 (MLflow's
batch limit). Each request is MLflow's own, with its retries and timeout
(``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``MLFLOW_HTTP_REQUEST_TIMEOUT``).

When the server fails (it does not answer, refuses, or errs), training goes on: the thread warns
once, keeps what it has not sent (the newest ``MAX_KEPT`` metric values; older ones are dropped
and counted), and tries again after a pause that doubles from ``RETRY_MIN_SEC`` to
``RETRY_MAX_SEC``; when the server answers again it sends what it kept, in order, and says so.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param

from pax_core import warn

BATCH = 1000  # metric values in one request (MLflow's limit)
MAX_KEPT = 100_000  # metric values kept while the server fails
RETRY_MIN_SEC = 0.5
RETRY_MAX_SEC = 10.0

# Opens the job's run (in the thread): its id, and the params it already has.
Opener = Callable[[MlflowClient], tuple[str, dict[str, str]]]


def _quoted(error: BaseException) -> str:
    """An error as one short line."""
    return f"{type(error).__name__}: {error}".splitlines()[0][:300]


class Sender:
    """A daemon thread sending one run's data to ``tracking_uri``; ``where`` names the server
    in messages."""

    def __init__(self, tracking_uri: str, where: str, opener: Opener):
        self._uri, self.where, self._opener = tracking_uri, where, opener
        self._work: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        # Owned by the thread:
        self._client: MlflowClient | None = None
        self.run_id: str | None = None
        self._known: dict[str, str] = {}  # the params the run has
        self._params: dict[str, str] = {}
        self._metrics: collections.deque[Metric] = collections.deque()
        self._dropped = 0
        self._status: str | None = None  # the status to end the run with, once asked
        self._ended = threading.Event()  # set by the thread once the run has ended
        self._failing = False
        self._pause = RETRY_MIN_SEC
        self._retry_at = 0.0  # time.monotonic() of the next try, while the server fails
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pax-mlflow", daemon=True)
        self._thread.start()

    # The logger's side: each call queues work and returns (``end`` once the run has ended).

    def params(self, params: dict[str, str]) -> None:
        self._work.put(("params", params))

    def metrics(self, metrics: list[Metric]) -> None:
        self._work.put(("metrics", metrics))

    def end(self, status: str, timeout: float) -> bool:
        """End the run with ``status`` once everything queued is sent, and wait for it; False
        after ``timeout``."""
        self._work.put(("end", status))
        return self._ended.wait(timeout)

    def stop(self) -> None:
        """Give up: the thread stops after the request it is in, sending nothing more."""
        self._stop.set()
        self._work.put(("stop",))

    @property
    def unsent(self) -> int:
        """Metric values not sent yet (read from the logger's thread: a moment's count)."""
        return len(self._metrics)

    # The thread's side.

    def _loop(self) -> None:
        while not self._stop.is_set():
            wait = max(0.0, self._retry_at - time.monotonic()) if self._owed() else None
            try:
                self._take(self._work.get(timeout=wait))
                while True:
                    self._take(self._work.get_nowait())
            except queue.Empty:
                pass
            if self._stop.is_set():
                return
            if time.monotonic() < self._retry_at:  # new work during a pause: it waits too
                continue
            self._send()
            if self._ended.is_set():
                return

    def _take(self, work: tuple[Any, ...]) -> None:
        kind = work[0]
        if kind == "params":
            self._params.update(work[1])
        elif kind == "metrics":
            self._metrics.extend(work[1])
            while len(self._metrics) > MAX_KEPT:
                self._metrics.popleft()
                self._dropped += 1
        elif kind == "end":
            self._status = work[1]

    def _owed(self) -> bool:
        return (self.run_id is None or bool(self._params) or bool(self._metrics)
                or (self._status is not None and not self._ended.is_set()))

    def _send(self) -> None:
        try:
            if self._client is None:  # a URI the client cannot use fails here, as a failure
                self._client = MlflowClient(self._uri)
            client = self._client
            if self.run_id is None:
                self.run_id, self._known = self._opener(client)
            if self._params:
                # A resumed run keeps the params it has (MLflow's cannot change); it takes new.
                new = {k: v for k, v in self._params.items() if k not in self._known}
                if new:
                    client.log_batch(self.run_id, params=[Param(k, v) for k, v in new.items()])
                self._known.update(new)
                self._params = {}
            while self._metrics:
                batch = [self._metrics[i] for i in range(min(BATCH, len(self._metrics)))]
                client.log_batch(self.run_id, metrics=batch)
                for _ in batch:
                    self._metrics.popleft()
            if self._status is not None and not self._ended.is_set():
                client.set_terminated(self.run_id, self._status)
                self._ended.set()
        except Exception as e:
            if not self._failing:
                warn(f"MLflow at {self.where} failed ({_quoted(e)}); training goes on, and the "
                     f"logger keeps what it has not sent and tries again")
            self._failing = True
            self._retry_at = time.monotonic() + self._pause
            self._pause = min(self._pause * 2, RETRY_MAX_SEC)
            return
        if self._failing:
            dropped = f" ({self._dropped} older values were dropped)" if self._dropped else ""
            warn(f"MLflow at {self.where} answers again; what was kept is sent{dropped}")
        self._failing, self._pause, self._dropped = False, RETRY_MIN_SEC, 0
