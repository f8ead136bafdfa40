"""``--profile-steps START:END``: a ``jax.profiler`` trace of a window of train steps.

The trace goes to ``JOB_DIR/profile/plugins/profile/<time>/``: TensorBoard's profile tab reads
it with ``--logdir JOB_DIR/profile``, and the ``*.trace.json.gz`` file opens in Perfetto. Each
traced step is a ``StepTraceAnnotation`` named ``train`` with its step number, which is what the
profile tools use to cut the timeline into steps. Steps are numbered as in the logs: step N is
the one after which N steps are done. In a ``gs://`` job the trace goes to the bucket without
the Perfetto file (JAX writes that one through a local path only).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import jax

from pax_core.errors import UsageError, warn
from pax_core.files import is_remote


def parse_steps(text: str) -> tuple[int, int]:
    """``"START:END"`` as a pair of step numbers, 1 <= START <= END."""
    start, sep, end = text.partition(":")
    try:
        first, last = int(start), int(end)
    except ValueError:
        first = last = 0
    if not sep or not 1 <= first <= last:
        raise UsageError(f"--profile-steps {text!r}: give START:END with 1 <= START <= END, "
                         f"e.g. --profile-steps 10:15 to trace steps 10 to 15")
    return first, last


class StepProfiler:
    """Starts the trace before step START (or the first step after it that runs) and stops it
    once step END has finished."""

    def __init__(self, steps: tuple[int, int] | None, job_dir: str):
        self.first, self.last = steps or (0, -1)
        self.directory = os.path.join(job_dir, "profile")
        self.tracing = self.done = False

    def check_window(self, start_step: int, num_train_steps: int) -> None:
        """Warn when no step of the window runs in this invocation."""
        if self.first and (self.last <= start_step or self.first > num_train_steps):
            warn(f"--profile-steps {self.first}:{self.last} traces nothing: this run does "
                 f"steps {start_step + 1} to {num_train_steps}")

    def step(self, number: int) -> contextlib.AbstractContextManager:
        """Enter around dispatching step ``number``."""
        if self.first <= number <= self.last and not (self.tracing or self.done):
            jax.profiler.start_trace(self.directory,
                                     create_perfetto_trace=not is_remote(self.directory))
            self.tracing = True
        if self.tracing:
            return jax.profiler.StepTraceAnnotation("train", step_num=number)
        return contextlib.nullcontext()

    def finished(self, number: int, outputs: Any) -> None:
        """Call after dispatching step ``number``; stops once the window's last step is done."""
        if self.tracing and number >= self.last:
            jax.block_until_ready(outputs)
            self.close()

    def close(self) -> None:
        """Stop the trace if it is running (the run ended inside the window)."""
        if self.tracing:
            self.tracing, self.done = False, True
            jax.profiler.stop_trace()
