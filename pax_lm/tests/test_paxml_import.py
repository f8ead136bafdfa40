"""``pax import paxml``: a checkpoint paxml 1.4 itself wrote (``data/paxml_tiny``: the
``TinyLm`` job of ``tests_paxml/praxis_side/train_and_reference.py``, paxml's
``TransformerLmSpmdAdam`` at 2 layers, width 32, GELU, 40 steps; its weights, step and one
optimizer count are kept, with praxis's logits on two rows of ids) imports
into Pax's catalogue experiment of that model and computes praxis's logits; what does not fit
is refused in one line, exit 2, nothing written. The ``paxml`` nox session trains fresh
checkpoints with paxml (rotary, gated, repeated layers, a separate embedding) and compares the
same way."""

from __future__ import annotations

import importlib
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from pax_core import UsageError, restore_latest
from pax_core.testing import import_job, isolated_host, run_pax

DATA = Path(__file__).parent / "data" / "paxml_tiny"
STEP = DATA / "checkpoints" / "checkpoint_00000040"
WEIGHTS = STEP / "state"
EXP = "LmCloudSpmdAdam"
TINY = ["NUM_LAYERS=2", "MODEL_DIMS=32", "HIDDEN_DIMS=64", "NUM_HEADS=4", "DIMS_PER_HEAD=8",
        "VOCAB_SIZE=64", "ACTIVATION='gelu'", "ICI_MESH_SHAPE=[1,8,1]", "MAX_SEQ_LEN=16"]


@pytest.fixture(scope="module")
def host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")))


def _logits(host, job: Path, ids: np.ndarray) -> np.ndarray:
    run, state, step = restore_latest(host, exp=None, plugin=None, set_items=[],
                                      job_dir=str(job))
    assert step == 0
    params = jax.device_get(state.params["decoder"])
    return np.asarray(jax.jit(run.task.model.decoder.apply)({"params": params}, ids))


@pytest.mark.parametrize(("source", "scanned", "mesh"), [(DATA, False, "[1,8,1]"),
                                                         (STEP, True, "[1,4,2]")],
                         ids=["job-dir-looped", "step-folder-scanned-model-parallel"])
def test_paxmls_checkpoint_computes_praxiss_logits(host, tmp_path, source, scanned, mesh):
    """From the paxml job directory (its newest step) or one step folder, into the looped or
    the scanned (``USE_REPEATED_LAYER``) model, on a data- or a model-parallel mesh: praxis's
    logits to float32 round-off."""
    reference = np.load(DATA / "reference.npz")
    record = import_job(host, format_name="paxml", source=str(source), output=str(tmp_path / "job"),
                        exp=EXP, set_items=[*TINY, f"USE_REPEATED_LAYER={scanned}",
                                            f"ICI_MESH_SHAPE={mesh}"])
    assert record["experiment"] == EXP and "step 40" in record["description"]
    logits = _logits(host, tmp_path / "job", reference["ids"])
    np.testing.assert_allclose(logits, reference["logits"], atol=1e-5, rtol=0)


def _refused(host, source: Path, output: Path, expected: str, exp: str | None = EXP,
             set_items: tuple[str, ...] = ()) -> None:
    with pytest.raises(UsageError) as raised:
        import_job(host, format_name="paxml", source=str(source), output=str(output), exp=exp,
                   set_items=[*TINY, *set_items])
    message = str(raised.value)
    assert "\n" not in message and expected in message, message
    assert not output.exists() and not output.with_name(output.name + ".partial").exists()


def _copy(tmp_path: Path) -> Path:
    copy = tmp_path / "paxml"
    shutil.copytree(DATA, copy)
    return copy / STEP.relative_to(DATA) / "state"


def test_without_exp_the_checkpoint_is_refused(host, tmp_path):
    _refused(host, DATA, tmp_path / "job", "name the experiment that trained it with --exp",
             exp=None)


def test_a_folder_that_is_no_paxml_checkpoint(host, tmp_path):
    _refused(host, tmp_path, tmp_path / "job", "holds no paxml checkpoint")


@pytest.mark.parametrize(("set_items", "named"), [
    (("USE_GATED_ACTIVATION=True",), "lacks mdl_vars.params.lm.transformer.x_layers_0.ff_layer"
                                     ".ffn_layer1_gate"),
    (("NUM_LAYERS=1",), "holds mdl_vars.params.lm.transformer.x_layers_1."),
    (("MODEL_DIMS=48",), "decoder/embedding/embedding is (64, 32) in the weights and (64, 48)"),
    (("TRAINABLE_POSITION_EMB=True",), "position/embedding has no counterpart in praxis's"),
])
def test_an_experiment_that_is_not_the_checkpoints_model(host, tmp_path, set_items, named):
    _refused(host, DATA, tmp_path / "job", named, set_items=set_items)


def test_a_missing_or_damaged_array(host, tmp_path):
    state = _copy(tmp_path)
    shutil.rmtree(state / "mdl_vars.params.lm.final_ln.scale")
    _refused(host, state, tmp_path / "job", "lacks mdl_vars.params.lm.final_ln.scale")
    chunk = state / "mdl_vars.params.lm.softmax.logits_ffn.linear.w" / "0.0"
    chunk.write_bytes(chunk.read_bytes()[:-20])
    shutil.copytree(DATA / STEP.relative_to(DATA) / "state" / "mdl_vars.params.lm.final_ln.scale",
                    state / "mdl_vars.params.lm.final_ln.scale")
    _refused(host, state, tmp_path / "job", "does not read as a zarr array")


def test_pax_export_does_not_write_paxml(host, tmp_path):
    import_job(host, format_name="paxml", source=str(DATA), output=str(tmp_path / "job"),
               exp=EXP, set_items=TINY)
    result = run_pax("export", "--job-dir", str(tmp_path / "job"), "--format", "paxml",
                     "--output", str(tmp_path / "out"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "pax export does not write it" in result.stderr
    assert not (tmp_path / "out").exists()
