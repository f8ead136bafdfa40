"""The logits a paxml checkpoint's own model gives, for ``pax import paxml`` to match.

Restores the latest checkpoint of a paxml training job with paxml itself (as its SPMD trainer
restores it) and runs praxis's forward pass on a fixed batch, through
``LanguageModel.compute_predictions``: the path training and evaluation take, packed-input
segment ids and positions included. The logits are those after the softmax's soft cap, which
is what the imported model has to produce. Writes ``JOB/reference.npz`` with ``ids`` (int32
[2, 16]) and ``logits`` (float32 [2, 16, vocab]).

Runs only in a paxml 1.4 environment (Python 3.10)::

    PYTHONPATH=pax_lm/tests_paxml/praxis_side python pax_lm/tests_paxml/praxis_side/reference.py \\
        --exp=tiny_experiments.TinyLm JOB
"""

from __future__ import annotations

import argparse
import importlib
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from paxml import checkpoints, experiment_registry, trainer_lib
from paxml.checkpoint_types import CheckpointType
from praxis import base_layer, pax_fiddle, py_utils

# The batch the importer's test feeds the imported model: fixed, so both sides agree on it.
IDS_SEED = 20240
BATCH, LENGTH = 2, 16


def write_reference(exp: str, job_dir: str) -> str:
    """Writes ``job_dir/reference.npz`` for experiment ``exp`` (``module.Class``) and returns
    its path."""
    importlib.import_module(exp.rsplit(".", 1)[0])  # registration happens on import
    exp_cls = experiment_registry.get(exp)
    if exp_cls is None:
        raise SystemExit(f"experiment {exp!r} is not registered; name it as module.Class")
    experiment = exp_cls()
    task_p = experiment.task()
    task = pax_fiddle.instantiate(task_p)
    model = task.model

    # The train state's shapes and shardings as the trainer derived them, from the train input.
    train_input = pax_fiddle.instantiate(experiment.datasets()[0])
    input_specs = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), train_input.get_next()
    )
    metadata = trainer_lib.create_train_state_metadata(task, input_specs)
    # The mesh the job trained on, from as many devices as it had (a caller may expose more).
    shape = model.hparams.ici_mesh_shape
    devices = np.array(jax.devices()[: math.prod(shape)]).reshape(shape)
    mesh = jax.sharding.Mesh(devices, model.hparams.mesh_axis_names)
    with mesh:
        state = checkpoints.restore_checkpoint(
            metadata.padded_global_shapes,
            os.path.join(job_dir, "checkpoints"),
            global_mesh=mesh,
            checkpoint_type=CheckpointType.GDA,
            state_specs=metadata.partition_specs,
            state_unpadded_shape_dtype_struct=metadata.unpadded_global_shapes,
        )

    vocab = task_p.model.lm_tpl.vocab_size
    ids = np.random.default_rng(IDS_SEED).integers(0, vocab, (BATCH, LENGTH)).astype(np.int32)
    batch = py_utils.NestedMap(
        ids=jnp.asarray(ids),
        labels=jnp.asarray(np.roll(ids, -1, axis=1)),
        paddings=jnp.zeros((BATCH, LENGTH), jnp.float32),
        weights=jnp.ones((BATCH, LENGTH), jnp.float32),
        segment_ids=jnp.ones((BATCH, LENGTH), jnp.int32),
        segment_pos=jnp.tile(jnp.arange(LENGTH, dtype=jnp.int32), (BATCH, 1)),
    )
    with base_layer.JaxContext.new_context(hparams=base_layer.JaxContext.HParams(do_eval=True)):
        predictions, _ = model.apply(
            state.mdl_vars, batch, method=model.compute_predictions, mutable=True
        )
    logits = np.asarray(predictions.logits, np.float32)

    path = os.path.join(job_dir, "reference.npz")
    np.savez(path, ids=ids, logits=logits)
    print(f"{exp}: step {int(state.step)} restored, logits {logits.shape} -> {path}")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exp", required=True, help="the experiment, as module.Class")
    parser.add_argument("job_dir", help="the --job_log_dir paxml.main trained into")
    args = parser.parse_args()
    if not os.path.isdir(os.path.join(args.job_dir, "checkpoints")):
        parser.exit(2, f"error: {args.job_dir} has no checkpoints/ folder; train it first\n")
    write_reference(args.exp, args.job_dir)


if __name__ == "__main__":
    main()
