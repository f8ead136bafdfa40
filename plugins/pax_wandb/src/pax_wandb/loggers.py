"""The ``wandb`` logger: a job's metrics and settings as one Weights & Biases run.

W&B's own environment variables choose what they choose for any W&B program: ``WANDB_MODE``
(online, offline, disabled), ``WANDB_PROJECT``, ``WANDB_ENTITY``, ``WANDB_NAME``,
``WANDB_DIR``, ``WANDB_RUN_GROUP``, ``WANDB_TAGS``, ``WANDB_API_KEY``, ``WANDB_BASE_URL``, ...
Where one is not set, the logger chooses for a job: the project ``pax``, the run named as the
job directory, the job type ``train``, and W&B's files under ``JOB_DIR/wandb`` (a job in a
bucket: under the system's temporary folder), so that nothing lands in the working directory.

A job is one run. Its id is chosen when the job first logs to W&B (``WANDB_RUN_ID``, else a new
one) and kept in ``JOB_DIR/wandb_run.json``, and every later invocation in the job directory
continues that run (W&B's ``resume="allow"``), as the job continues its checkpoints.

Each summary is a history row at its training step (``train/loss``, ``eval/test/accuracy``).
W&B keeps a run's steps increasing and drops a row for a step it has passed: after a resume, the
steps the earlier invocation logged and then trained again from its checkpoint. A resume repeats
those steps exactly, so what W&B keeps is what the training gave.

The run's config is the run's settings (``hparams``: the experiment, the parameter count, the
batch, the device count, ...) with the job's settings from the config text the loop hands its
loggers: the ``--set`` overrides and every setting of the config tree by its path
(``task.train.learner.optimizer.learning_rate``).

``wandb.log`` hands a row to W&B's service process, which does the network work and its
retries, so the loop never waits on the tracking server. ``wandb.init`` waits for that service
(and, online, for the server, up to W&B's ``init_timeout``) once, before the first step; a
failure there, or later, is the logger group's to report: a warning, and the run goes on
without W&B.

The run ends in ``finish``, which the loop calls with how the training ended, just before
``close``: finished; failed (exit code 1); or, for a run stopped on request to be resumed, W&B's
preempted (``mark_preempting``, then exit code 0). A logger used from Python that is closed
without ``finish`` ends its run finished, as W&B's own ``finish()`` does: a run left open would
stay so until the process exits, and a later job in the process would make a new one beside it.
"""

from __future__ import annotations

import json
import os
import secrets
import string
import tempfile
from collections.abc import Mapping
from typing import Any

import wandb
from etils import epath

from pax_core import Logger, UsageError, warn, write_atomic
from pax_wandb.settings import config_settings

PROJECT = "pax"  # a run's project when WANDB_PROJECT is not set
RUN_FILE = "wandb_run.json"  # in the job directory: {"id": the job's W&B run id}
ID_CHARACTERS = string.ascii_lowercase + string.digits  # those of the ids W&B makes


class WandbLogger(Logger):
    """One W&B run per job directory; see the module's documentation."""

    def __init__(self, job_dir: str):
        super().__init__(job_dir)
        self._job = epath.Path(job_dir)
        self._run: Any = None  # the wandb.Run, from start()

    def start(self, *, experiment: str, start_step: int, num_train_steps: int,
              hparams: Mapping[str, Any]) -> None:
        chosen = os.environ.get
        self._run = wandb.init(
            id=self._run_id(), resume="allow",
            # A new run whatever runs in this process (a notebook's own, a previous job's).
            reinit="create_new",
            project=None if chosen("WANDB_PROJECT") else PROJECT,
            name=None if chosen("WANDB_NAME") else self._job.name,
            dir=None if chosen("WANDB_DIR") else self._files_dir(),
            job_type=None if chosen("WANDB_JOB_TYPE") else "train",
        )
        # A resumed job may train with other settings (more steps, say): they replace the old.
        self._run.config.update(dict(hparams), allow_val_change=True)

    def write(self, step: int, kind: str, metrics: Mapping[str, float]) -> None:
        self._run.log({f"{kind}/{name}": float(value) for name, value in metrics.items()},
                      step=step)

    def text(self, step: int, tag: str, text: str) -> None:
        if tag == "config":  # the job's config.txt, which the loop hands its loggers at start
            self._run.config.update(config_settings(text), allow_val_change=True)

    def _run_id(self) -> str:
        """The job's run id: the one its record keeps, else a new one, recorded."""
        record = self._job / RUN_FILE
        given = os.environ.get("WANDB_RUN_ID")
        if record.exists():
            try:
                kept = json.loads(record.read_text())["id"]
            except (ValueError, KeyError, TypeError) as e:
                raise UsageError(f"{record} is not a W&B run record ({type(e).__name__}: {e}); "
                                 f"remove it to start a new W&B run for this job") from None
            if given and given != kept:
                warn(f"WANDB_RUN_ID={given} is not this job's W&B run: the job continues its "
                     f"own, {kept} ({record})")
            return kept
        run_id = given or "".join(secrets.choice(ID_CHARACTERS) for _ in range(8))
        write_atomic(record, json.dumps({"id": run_id}) + "\n")
        return run_id

    def _files_dir(self) -> str:
        """Where W&B writes its files: the job directory, or, for a job in a bucket (which W&B
        cannot write to), the system's temporary folder."""
        if not str(self._job).startswith("gs://"):
            return os.fspath(self._job)
        local = os.path.join(tempfile.gettempdir(), "pax-wandb")
        os.makedirs(local, exist_ok=True)
        return local

    def finish(self, status: str) -> None:
        """End the run with how the training ended (nothing when ``start`` never made one)."""
        run, self._run = self._run, None
        if run is None:
            return
        if status == "interrupted":  # stopped on request, to be resumed
            run.mark_preempting()
        run.finish(exit_code=1 if status == "failed" else 0)

    def close(self) -> None:
        """End a run that ``finish`` has not ended as completed (see the module's documentation)."""
        self.finish("completed")
