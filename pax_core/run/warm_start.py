"""Warm starts: a new job's parameters from another model (Pax's ``init_from_checkpoint_rules``).

``task.train.init_from`` names the source: another job directory (its newest checkpoint), a
``pax export`` folder, or a folder a registered weight format recognises (a Hugging Face
folder). It applies only when the job has no checkpoint of its own: a resumed job continues
from its own checkpoints, never from the source again.

Each of the model's parameters, by its path (``decoder/stack/layer_0/attention/query/kernel``),
goes through ``init_from_ignore`` (regular expressions: matched parameters keep their fresh
values, as Pax's ignore rules), then the first of ``init_from_rules`` whose regular expression
matches the whole path: its format, filled with the match's groups (``"{}".format(*groups)``,
Pax's convention), names the source's parameter. A parameter no rule maps, or whose source
is absent, is an error unless ``init_from_optional`` matches it or ``init_from_partial`` is
set (it then keeps its fresh value); a shape that differs always is. Source parameters are
read onto the host and placed where this run keeps them, so the source may have been trained
on any mesh. The optimizer state then starts
afresh on the new weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np

from pax_core.checkpointers.base import Weights
from pax_core.errors import PaxError, UsageError
from pax_core.files import job_path
from pax_core.models.weight_format import key_paths
from pax_core.plugins.host import PluginHost
from pax_core.run.build import weight_format
from pax_core.run.state import TrainState


def _names(tree: Any) -> dict[str, Any]:
    """Each leaf by its path as the rules read it: ``decoder/stack/layer_0/...``."""
    return {"/".join(path): leaf for path, leaf in key_paths(tree).items()}


def _orbax_params(directory: Any, under: str | None) -> dict[str, np.ndarray]:
    """The parameters of an Orbax tree at ``directory`` (its entry ``under``, or all of it),
    as host arrays, whatever mesh saved them."""
    import orbax.checkpoint as ocp

    checkpointer = ocp.PyTreeCheckpointer()
    tree = checkpointer.metadata(directory).item_metadata.tree
    wanted = {under: tree[under]} if under else tree
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), wanted)
    restored = checkpointer.restore(directory, args=ocp.args.PyTreeRestore(
        item=wanted, restore_args=args, partial_restore=True))
    return _names(restored[under] if under else restored)


def _newest_step(checkpoints: Path) -> Path:
    steps = sorted((int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()),
                   reverse=True)
    for step in steps:
        if (checkpoints / str(step) / "state").is_dir():
            return checkpoints / str(step)
    raise UsageError(f"init_from {checkpoints.parent}: no complete checkpoint in {checkpoints}")


def source_params(host: PluginHost, source: str, model: Any) -> dict[str, np.ndarray]:
    """The source's parameters by path: a job directory's newest checkpoint, a ``pax export``
    folder's ``params``, or what a registered weight format reads of its folder."""
    root = job_path(source)
    if not root.exists():
        raise UsageError(f"init_from {source} does not exist; give a job directory, a pax "
                         f"export folder or a model folder a weight format reads")
    if (root / "checkpoints").is_dir():
        return _orbax_params(_newest_step(root / "checkpoints") / "state", "params")
    if (root / "params").is_dir() and (root / "export.json").exists():
        return _orbax_params(root / "params", None)
    for name in host.components("weight_formats").names():
        fmt = weight_format(host, name)
        if fmt.recognises(Path(root)):
            return {"/".join(path): array for path, array in fmt.read(Path(root), model)}
    raise UsageError(f"init_from {source} is neither a job directory, a pax export folder nor "
                     f"a folder a weight format recognises")


def warm_start(host: PluginHost, run: Any, fresh: TrainState) -> TrainState:
    """``fresh`` (a new state of ``run``) with its parameters from ``task.train.init_from``,
    and the optimizer state started afresh on them."""
    train = run.task.train
    try:
        found = source_params(host, train.init_from, run.task.model)
    except PaxError:
        raise
    except Exception as e:
        raise UsageError(f"init_from {train.init_from} does not read: {type(e).__name__}: "
                         f"{e}") from None
    abstract = _names(run.abstract_state.params)
    current = _names(fresh.params)
    chosen, loaded = {}, 0
    for name, want in abstract.items():
        if train.init_from_ignores(name):
            chosen[name] = current[name]
            continue
        source = train.init_from_source(name)
        if source is None or source not in found:
            if not (train.init_from_partial or train.init_from_may_lack(name)):
                why = "no rule maps it" if source is None else f"it has no {source}"
                raise UsageError(f"init_from {train.init_from}: parameter {name} cannot be "
                                 f"initialised ({why}); add a rule, or match it in "
                                 f"task.train.init_from_optional (or set task.train."
                                 f"init_from_partial=True) to keep its fresh value")
            chosen[name] = current[name]
            continue
        value = found[source]
        if tuple(value.shape) != tuple(want.shape):
            raise UsageError(f"init_from {train.init_from}: {source} is {tuple(value.shape)} "
                             f"and parameter {name} {tuple(want.shape)}")
        host_value = np.asarray(value, want.dtype)
        chosen[name] = jax.make_array_from_callback(
            want.shape, want.sharding, lambda index, v=host_value: v[index])
        loaded += 1
    if loaded == 0:
        raise UsageError(f"init_from {train.init_from}: no parameter of this model was found "
                         f"there; check init_from_rules")
    structure = jax.tree.structure(run.abstract_state.params)
    params = jax.tree.unflatten(structure, [chosen[n] for n in abstract])
    return run.state_from_weights(Weights(params, fresh.model_state))
