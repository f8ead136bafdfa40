"""The ``mlflow`` logger: a job's metrics and settings as one MLflow run.

Where the run goes is MLflow's to say, as for any MLflow program: ``MLFLOW_TRACKING_URI`` (or
``mlflow.set_tracking_uri`` in the process that trains, from Python), and MLflow's own
credentials (``MLFLOW_TRACKING_TOKEN``, ``MLFLOW_TRACKING_USERNAME``, ...). A tracking URI is
required: MLflow's own default, a database file in the working directory, is not where a
job's run belongs, so a run without one stops before training. The experiment is
``MLFLOW_EXPERIMENT_ID`` or ``MLFLOW_EXPERIMENT_NAME``, else the Pax experiment's name
(``core/MlpSynthetic``), made when it does not exist yet.

A job is one run, named as the job directory and tagged with it (``pax.job_dir``) and the Pax
experiment (``pax.experiment``). Its id is kept in ``JOB_DIR/mlflow_run.json`` once the server
has made it, and every later invocation in the job directory continues that run (RUNNING
again), as the job continues its checkpoints; a run that is not on the server any more (another
server, a deleted run) is replaced by a new one, with a warning.

The params are the run's settings (``hparams``) with the job's settings from the config text the
loop hands its loggers (``params``: the ``--set`` overrides and every setting of the config tree
by its path), cut to MLflow's limits. MLflow params cannot change, so a resumed run keeps the
values it has and takes only settings it did not have. The metrics are each summary's values at
their training step (``train/loss``, ``eval/test/accuracy``); a resume logs the steps after its
checkpoint again, which MLflow keeps beside the earlier values of those steps (the same values:
a resume repeats them exactly).

Everything goes through a thread of its own (``sender``), so the loop never waits on the server,
and a server that fails is a warning, not a failed run. The run ends in ``finish``, which the loop
calls with how the training ended, just before ``close``: FINISHED, KILLED (stopped on request, to
be resumed) or FAILED, once the server has what is left to send. The logger waits up to
``FLUSH_TIMEOUT_SEC`` for that, then gives up with a warning saying what is left out (the run
stays RUNNING). A logger used from Python that is closed without ``finish`` ends its run
FINISHED, as MLflow's own ``end_run()`` does, rather than leave it RUNNING for good.
"""

from __future__ import annotations

import json
import os
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

import mlflow
from etils import epath
from mlflow import MlflowClient
from mlflow.entities import Metric
from mlflow.exceptions import MlflowException

from pax_core import Logger, UsageError, warn, write_atomic
from pax_mlflow.params import as_params, config_params, mlflow_name
from pax_mlflow.sender import Sender

RUN_FILE = "mlflow_run.json"  # in the job directory: {"run_id": the job's MLflow run id}
FLUSH_TIMEOUT_SEC = 30.0  # how long the end of a run waits for the server
STATUSES = {"completed": "FINISHED", "interrupted": "KILLED", "failed": "FAILED"}


def shown(uri: str) -> str:
    """A tracking URI as messages show it: without a password it may hold."""
    parts = urllib.parse.urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    return urllib.parse.urlunsplit(parts._replace(netloc="***@" + parts.netloc.split("@")[-1]))


def _given_up(sender: Sender) -> str:
    """The warning for a server that has not ended the run in time: what it has not done."""
    unsent, run_id = sender.unsent, sender.run_id
    server, within = f"MLflow at {sender.where}", f"within {FLUSH_TIMEOUT_SEC:.0f} s"
    if unsent:
        stays = f"; run {run_id} stays RUNNING" if run_id else ""
        return (f"{server} has not taken the last {unsent} metric values {within}: they are "
                f"left out (metrics.jsonl has every value){stays}")
    if run_id is None:
        return f"{server} has not made this job's run {within}: this invocation is left out"
    return f"{server} has not ended run {run_id} {within}: it stays RUNNING"


class MlflowLogger(Logger):
    """One MLflow run per job directory; see the module's documentation."""

    def __init__(self, job_dir: str):
        super().__init__(job_dir)
        if not mlflow.tracking.is_tracking_uri_set():
            raise UsageError(
                "the mlflow logger has no tracking server: set MLFLOW_TRACKING_URI (an "
                "MLflow server, http://HOST:5000, or a database, sqlite:////PATH/mlflow.db), "
                "or leave mlflow out of LOGGERS")
        self._job = epath.Path(job_dir)
        self._uri = mlflow.get_tracking_uri()
        self._sender: Sender | None = None

    def start(self, *, experiment: str, start_step: int, num_train_steps: int,
              hparams: Mapping[str, Any]) -> None:
        self._sender = Sender(self._uri, shown(self._uri),
                              lambda client: self._open(client, experiment))
        self._sender.params(as_params(hparams))

    def write(self, step: int, kind: str, metrics: Mapping[str, float]) -> None:
        now = int(time.time() * 1000)
        self._sender.metrics([Metric(mlflow_name(f"{kind}/{name}"), float(value), now, step)
                              for name, value in metrics.items()])

    def text(self, step: int, tag: str, text: str) -> None:
        if tag == "config":  # the job's config.txt, which the loop hands its loggers at start
            self._sender.params(config_params(text))

    def finish(self, status: str) -> None:
        """End the run with how the training ended once the server has everything, waiting up
        to ``FLUSH_TIMEOUT_SEC``; then the thread is done (nothing when ``start`` never ran)."""
        sender, self._sender = self._sender, None
        if sender is None:
            return
        if not sender.end(STATUSES[status], FLUSH_TIMEOUT_SEC):
            warn(_given_up(sender))
        sender.stop()

    def close(self) -> None:
        """End a run that ``finish`` has not ended as completed (see the module's documentation)."""
        self.finish("completed")

    def _open(self, client: MlflowClient, experiment: str) -> tuple[str, dict[str, str]]:
        """The job's run, continued or made (in the sender's thread): its id and params."""
        record = self._job / RUN_FILE
        if record.exists():
            try:
                run_id = json.loads(record.read_text())["run_id"]
            except (ValueError, KeyError, TypeError) as e:
                raise UsageError(f"{record} is not an MLflow run record ({type(e).__name__}: "
                                 f"{e}); remove it to start a new MLflow run for this job"
                                 ) from None
            kept = self._kept_run(client, run_id)
            if kept is not None:
                client.update_run(run_id, status="RUNNING")
                return run_id, dict(kept.data.params)
        run = client.create_run(self._experiment_id(client, experiment),
                                run_name=self._job.name,
                                tags={"pax.job_dir": self.job_dir, "pax.experiment": experiment})
        write_atomic(record, json.dumps({"run_id": run.info.run_id}) + "\n")
        return run.info.run_id, {}

    def _kept_run(self, client: MlflowClient, run_id: str) -> Any:
        """The run ``run_id`` when the server still has it, else None (with a warning)."""
        try:
            run = client.get_run(run_id)
        except MlflowException as e:
            if e.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            run = None
        if run is not None and run.info.lifecycle_stage != "deleted":
            return run
        warn(f"this job's MLflow run {run_id} is not at {shown(self._uri)} (another server, or "
             f"deleted); the job goes on in a new run")
        return None

    @staticmethod
    def _experiment_id(client: MlflowClient, experiment: str) -> str:
        """MLFLOW_EXPERIMENT_ID, or the id of MLFLOW_EXPERIMENT_NAME (default: the Pax
        experiment's name), made when it does not exist."""
        if os.environ.get("MLFLOW_EXPERIMENT_ID"):
            return os.environ["MLFLOW_EXPERIMENT_ID"]
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or experiment
        found = client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return client.create_experiment(name)
        except MlflowException as e:  # made meanwhile, by another job of a sweep
            if e.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            return client.get_experiment_by_name(name).experiment_id
