"""``LORA_RANK``: an LM experiment trains low-rank adapters alone. The base weights stay
bitwise as they were, the adapters move and the loss falls, and the optimizer holds state
for the adapters only: a small fraction of full fine-tuning's. On an imported job the
adapters start fresh beside the imported weights (a source that has adapters continues them:
``test_dpo``)."""

from __future__ import annotations

import importlib

import jax
import numpy as np
import pytest

from pax_core.testing import first_batch_steps, import_job, isolated_host, read_params, run_pax

TINY = ["NUM_TRAIN_STEPS=8", "LEARNING_RATE=1e-2", "LR_SCHEDULE='constant'"]


@pytest.fixture(scope="module")
def host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")))


def _train(host, set_items: list[str], steps: int = 8):
    start, end, metrics = first_batch_steps(host, "TinyLmForTests", None, [*TINY, *set_items],
                                            steps)
    return start, end, [m["loss"] for m in metrics]


def _leaves(tree) -> dict[str, np.ndarray]:
    return {"/".join(str(k.key) for k in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _size(tree) -> int:
    return sum(np.size(leaf) for leaf in jax.tree.leaves(tree))


def test_adapters_train_alone_and_the_optimizer_holds_only_theirs(host):
    start, end, losses = _train(host, ["LORA_RANK=4", "LORA_TARGETS=('query','value','down')"])
    before, after = _leaves(start.params), _leaves(end.params)
    adapters = {k for k in before if k.rsplit("/", 1)[-1].startswith("lora_")}
    assert adapters and all(not np.array_equal(before[k], after[k]) for k in adapters
                            if k.endswith("lora_b"))
    for name in set(before) - adapters:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
    assert losses[-1] < losses[0] - 0.05, losses
    adapter_weights = sum(before[k].size for k in adapters)
    assert adapter_weights < 0.05 * _size(start.params)
    _, full, _ = _train(host, [], steps=1)
    # Adam's two moments of each adapter weight (and counters), none of the base's.
    assert 2 * adapter_weights <= _size(end.opt_state) < 2 * adapter_weights + 16
    assert _size(full.opt_state) >= 2 * _size(full.params)


def test_adapters_on_an_imported_job_start_fresh_and_train_alone(host, tmp_path):
    """An imported job's weights-only step lacks the adapters ``LORA_RANK`` adds: they start
    fresh (``init_from_optional``), the imported weights stay as imported."""
    from test_paxml_import import DATA, EXP, TINY

    job = tmp_path / "job"
    import_job(host, format_name="paxml", source=str(DATA), output=str(job), exp=EXP,
               set_items=TINY)
    imported = read_params(job, step=0)  # by path: "['decoder']['stack']..."
    result = run_pax("train", "--job-dir", str(job), "--set", "LORA_RANK=2",
                     "--set", "NUM_TRAIN_STEPS=3", "--set", "LEARNING_RATE=1e-2")
    assert result.returncode == 0, result.stderr
    trained = read_params(job, step=3)
    adapters = {k for k in trained if "['lora_" in k}
    assert adapters and set(trained) - adapters == set(imported)
    for name, value in imported.items():
        np.testing.assert_array_equal(trained[name], value, err_msg=name)
    assert all(np.abs(trained[k]).max() > 0 for k in adapters if k.endswith("['lora_b']"))


def test_parameters_an_imported_step_lacks_are_refused_unless_optional(host, tmp_path):
    from test_paxml_import import DATA, EXP, TINY

    job = tmp_path / "job"
    import_job(host, format_name="paxml", source=str(DATA), output=str(job), exp=EXP,
               set_items=TINY)
    result = run_pax("train", "--job-dir", str(job), "--set", "LORA_RANK=2",
                     "--set", "task.train.init_from_optional=()", "--set", "NUM_TRAIN_STEPS=1")
    assert result.returncode == 2, result.stderr
    assert "lora_a'] is absent in the checkpoint" in result.stderr, result.stderr
