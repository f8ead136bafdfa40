"""``pax import FORMAT SOURCE --output JOB_DIR``: a model from another framework's files, as a
new job directory that ``pax train``, ``pax eval`` and ``pax decode`` use as it is.

The format (``pax_core.models.weight_format``) says which experiment rebuilds the source's
model and yields its weights one tensor at a time; this module does the rest, the same for
every format: each tensor is checked against the model's parameters (name, shape) and handed
to the checkpointer as it arrives (``Checkpointer.save_weights``: Orbax writes each into the
step as it comes), so the host holds one tensor at a time; the job's run is recorded (its
experiment and overrides, as ``pax train`` records them, so the job's readers and ``pax
train`` without ``--exp`` rebuild the same model); carried files go to ``JOB_DIR/assets``;
and step 0 is a weights-only checkpoint, from which ``pax train`` starts the optimizer
afresh. The job is built in ``JOB_DIR.partial`` and renamed into place when complete, so a
failed or interrupted import leaves no job behind.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from pax_core.commands.jobs import config_text, prepare_run
from pax_core.commands.output_folder import OutputFolder
from pax_core.errors import PaxError, UsageError
from pax_core.models.weight_format import ParamPath, key_paths
from pax_core.plugins.host import PluginHost
from pax_core.run.build import weight_format
from pax_core.run.jobdir import JobDir
from pax_core.run.state import count_params

ASSETS = "assets"


def import_job(host: PluginHost, *, format_name: str, source: str, output: str,
               exp: str | None = None, set_items: list[str] | None = None,
               platform: str | None = None) -> dict[str, Any]:
    """Import ``source`` (read by the format ``format_name``) as the job ``output``; returns
    what was imported (experiment, parameter count, description)."""
    src = Path(source).expanduser().resolve()
    if not src.exists():
        raise UsageError(f"{source} does not exist; give the folder (or file) to import")
    folder = OutputFolder(output, "import")
    fmt = weight_format(host, format_name)
    if not fmt.reads:
        raise UsageError(f"{format_name}: pax import does not read it (pax export --format "
                         f"{format_name} writes it)")
    found = fmt.inspect(src, folder.target / ASSETS, exp, list(set_items or []))
    jd = JobDir(folder.partial)
    run = prepare_run(host, found.experiment, None, found.overrides, jd, platform, None,
                      read_data=False)
    with folder.writing():
        tensors = _checked(fmt.read(src, run.task.model), run.abstract_state.params, src)
        _write_job(host, run, jd, found, tensors)
    return {"experiment": found.experiment, "overrides": found.overrides,
            "num_params": count_params(run.abstract_state.params), "source": str(src),
            "description": found.description, "job_dir": str(folder.target)}


def _write_job(host: PluginHost, run: Any, jd: JobDir, found: Any,
               tensors: Iterator[tuple[ParamPath, np.ndarray]]) -> None:
    assets = jd.path / ASSETS
    if found.files:
        assets.mkdir()
        for name, path in found.files.items():
            shutil.copyfile(path, assets / name)
    checkpointer = run.make_checkpointer(str(jd.checkpoints))
    try:
        checkpointer.save_weights(0, tensors)
    finally:
        checkpointer.close()
    jd.record(experiment=run.resolved.name, overrides=run.resolved.overrides,
              config_json=run.resolved.to_json(), config_text=config_text(run.resolved, host),
              plugins=host.active_versions(), extra={"imported_from": found.description})


def _checked(tensors: Iterator[tuple[ParamPath, np.ndarray]], abstract: Any, source: Path
             ) -> Iterator[tuple[ParamPath, np.ndarray]]:
    """The format's ``(path, array)`` pairs, each checked against the model's parameters as it
    passes (its path, that it comes once, its shape), in the source's dtype (a restore widens
    it); once they are all through, that none is missing."""
    leaves = key_paths(abstract)
    seen: set[ParamPath] = set()
    try:
        for path, array in tensors:
            name = "/".join(path)
            want = leaves.get(path)
            if want is None:
                raise UsageError(f"{source}: the weights hold {name}, which this model does "
                                 f"not have; the source's configuration and weights disagree")
            if path in seen:
                raise UsageError(f"{source}: {name} comes twice in the weights")
            if tuple(array.shape) != tuple(want.shape):
                raise UsageError(f"{source}: {name} is {tuple(array.shape)} in the weights and "
                                 f"{tuple(want.shape)} in the model its configuration describes")
            if not jnp.issubdtype(array.dtype, jnp.floating):  # bfloat16 included
                raise UsageError(f"{source}: {name} holds {array.dtype} values, not weights")
            seen.add(path)
            yield path, array
    except PaxError:
        raise
    except (OSError, ValueError) as e:  # the format's reading of a damaged file
        raise UsageError(f"{source}: its weights do not read ({e}); check the files (nothing "
                         f"was written)") from None
    missing = sorted("/".join(p) for p in leaves if p not in seen)
    if missing:
        raise UsageError(f"{source}: the weights lack {missing[0]}"
                         f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}, which "
                         f"the model its configuration describes holds")

