"""``pax export``: a job's trained parameters alone, for serving or for another framework.

The output directory holds ``params/`` (an Orbax checkpoint of the parameters only: no
optimizer state, no input position; the moving average when the job evaluates it,
``task.train.eval_use_ema_states``), ``model_state/`` beside it for a model that keeps one
(batch norm's moving statistics, without which it cannot be served), ``config.json`` (the
job's Fiddle config) and ``export.json`` (the experiment, the step, the parameter count and
where they came from). With ``--format NAME`` a registered weight format
(``pax_core.models.weight_format``: ``hf`` from pax-lm) writes the folder in its own layout
instead, beside ``export.json``. The folder only ever appears whole, and nothing already there
is overwritten (``output_folder.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np

from pax_core.commands.jobs import restore_latest
from pax_core.commands.output_folder import OutputFolder
from pax_core.errors import UsageError
from pax_core.files import job_path, write_atomic
from pax_core.models.weight_format import ParamPath, key_paths
from pax_core.run.build import weight_format
from pax_core.run.state import count_params


def export_params(host: Any, *, job_dir: str, output: str, exp: str | None = None,
                  plugin: str | None = None, set_items: list[str] | None = None,
                  step: int | None = None, platform: str | None = None,
                  format_name: str | None = None) -> dict[str, Any]:
    """Write the parameters of ``job_dir``'s latest checkpoint (or ``step``) to ``output``;
    returns what ``export.json`` records. With ``format_name`` a registered weight format
    writes them in its layout instead (``pax export --format hf``)."""
    import jax
    import orbax.checkpoint as ocp

    folder = OutputFolder(output, "export")  # checked before the job is restored
    fmt = weight_format(host, format_name) if format_name else None
    if fmt is not None and not fmt.writes:
        raise UsageError(f"--format {format_name}: pax export does not write it (pax import "
                         f"reads it); export without --format for Pax's own layout")
    if fmt is not None and jax.process_count() > 1:
        raise UsageError(f"pax export --format {format_name} runs in one process; export on one "
                         f"host (its devices may be any number)")
    run, state, restored = restore_latest(host, exp=exp, plugin=plugin, set_items=set_items or [],
                                          job_dir=job_dir, platform=platform, step=step)
    params = run.eval_params(state)
    record = {"experiment": run.resolved.name, "step": restored,
              "num_params": count_params(params), "ema": run.task.train.eval_use_ema_states,
              "job_dir": str(job_path(job_dir)), "format": format_name or "orbax"}
    with folder.writing(primary=jax.process_index() == 0) as partial:
        if fmt is not None:
            fmt.write(partial, run.task.model, _fetcher(params), run.job.datasets)
        else:
            with ocp.StandardCheckpointer() as checkpointer:
                checkpointer.save(partial / "params", params)
                if state.model_state:
                    checkpointer.save(partial / "model_state", state.model_state)
        if jax.process_index() == 0:
            if fmt is None:  # a format's folder has its own config.json
                write_atomic(partial / "config.json", run.resolved.to_json())
            write_atomic(partial / "export.json", json.dumps(record, indent=1) + "\n")
    return record


def _fetcher(params: Any) -> Callable[[ParamPath], np.ndarray]:
    """One parameter at a time from the devices, by key path, as a host array."""
    from jax.experimental import multihost_utils

    leaves = key_paths(params)

    def fetch(path: ParamPath) -> np.ndarray:
        leaf = leaves[tuple(path)]
        if not leaf.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
        return np.asarray(leaf)

    return fetch
