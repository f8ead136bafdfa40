"""``pax import paxml`` of checkpoints paxml 1.4's own trainer wrote (``conftest.py``): each
tiny variant of praxis's TransformerLm, imported into Pax's catalogue experiment with the same
constants, computes praxis's logits to float32 round-off, whichever of the two layer layouts
(paxml's looped ``x_layers_<i>`` or its repeated stack) meets whichever of Pax's (looped or
scanned)."""

from __future__ import annotations

import importlib
from pathlib import Path

import jax
import numpy as np
import pytest

from pax_core import restore_latest
from pax_core.testing import import_job, isolated_host

EXP = "LmCloudSpmdAdam"
TINY = ["NUM_LAYERS=2", "MODEL_DIMS=32", "HIDDEN_DIMS=64", "NUM_HEADS=4", "DIMS_PER_HEAD=8",
        "VOCAB_SIZE=64", "MAX_SEQ_LEN=16", "ICI_MESH_SHAPE=[1,4,2]"]
# paxml's experiment -> the --set overrides that make Pax's catalogue experiment its model.
VARIANTS = {
    "TinyLm": ["ACTIVATION='gelu'"],
    "TinyLmRotaryGated": ["ACTIVATION='silu'", "USE_GATED_ACTIVATION=True",
                          "USE_ROTARY_POSITION_EMB=True"],
    "TinyLmRepeatedSeparate": ["SEPARATE_EMBEDDING=True"],
}


@pytest.fixture(scope="module")
def host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")))


def _logits(host, job: Path, ids: np.ndarray) -> np.ndarray:
    run, state, _ = restore_latest(host, exp=None, plugin=None, set_items=[], job_dir=str(job))
    params = jax.device_get(state.params["decoder"])
    return np.asarray(jax.jit(run.task.model.decoder.apply)({"params": params}, ids))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("scanned", [False, True], ids=["looped", "scanned"])
def test_a_paxml_checkpoint_computes_praxiss_logits(host, paxml_runs, tmp_path, variant,
                                                    scanned):
    reference = np.load(paxml_runs / variant / "reference.npz")
    record = import_job(host, format_name="paxml", source=str(paxml_runs / variant),
                        output=str(tmp_path / "job"), exp=EXP,
                        set_items=[*TINY, *VARIANTS[variant], f"USE_REPEATED_LAYER={scanned}"])
    assert "step 40" in record["description"]
    logits = _logits(host, tmp_path / "job", reference["ids"])
    np.testing.assert_allclose(logits, reference["logits"], atol=1e-5, rtol=0)
