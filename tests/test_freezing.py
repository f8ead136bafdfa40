"""Frozen parameters (``task.train.learner.bprop_variable_inclusion`` / ``exclusion``, Pax's
names): they keep their values bitwise, get no gradient and hold no optimizer state, while the
rest train as before; patterns that match nothing or freeze everything are one line."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from pax_core.testing import first_batch_steps, isolated_host, run_pax

EXCLUDE_FIRST = "task.train.learner.bprop_variable_exclusion=('Dense_0/.*',)"


def _steps(set_items: list[str], steps: int = 5):
    start, end, metrics = first_batch_steps(isolated_host(), "MlpSynthetic", None, set_items,
                                            steps)
    return start, end, [m["grad_norm"] for m in metrics]


def _sizes(tree) -> int:
    return sum(np.size(leaf) for leaf in jax.tree.leaves(tree))


def test_a_frozen_layer_keeps_its_values_and_has_no_optimizer_state():
    start, end, norms = _steps([EXCLUDE_FIRST])
    frozen, trained = start.params["Dense_0"], {k: v for k, v in start.params.items()
                                                if k != "Dense_0"}
    for name, value in frozen.items():
        np.testing.assert_array_equal(end.params["Dense_0"][name], value)
    for layer, weights in trained.items():
        for name, value in weights.items():
            assert not np.array_equal(end.params[layer][name], value), (layer, name)
    # Adam keeps two moments of every trained weight and none of the frozen ones, and the
    # backward pass stops at the frozen layer: the first step's gradient (same weights, same
    # batch) has no part of it, so its norm is smaller than the whole model's.
    _, everything, unfrozen_norms = _steps([], steps=1)
    frozen_size = _sizes(frozen)
    assert _sizes(everything.opt_state) - _sizes(end.opt_state) == 2 * frozen_size
    assert norms[0] < 0.999 * unfrozen_norms[0]


def test_inclusion_trains_only_what_it_names():
    start, end, _ = _steps(["task.train.learner.bprop_variable_inclusion=('Dense_1/bias',)"])
    changed = {f"{layer}/{name}" for layer, weights in start.params.items()
               for name, value in weights.items()
               if not np.array_equal(end.params[layer][name], value)}
    assert changed == {"Dense_1/bias"}


@pytest.mark.parametrize(("item", "message"), [
    ("bprop_variable_exclusion=('Dense_9/.*',)", "bprop_variable_exclusion 'Dense_9/.*' "
                                                  "matches no parameter"),
    ("bprop_variable_inclusion=('nothing',)", "bprop_variable_inclusion 'nothing' matches no "
                                              "parameter"),
    ("bprop_variable_exclusion=('.*',)", "freeze every parameter"),
    ("bprop_variable_exclusion=('(',)", "is not a regular expression"),
])
def test_bad_freezing_patterns_are_one_line(tmp_path, item, message):
    result = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(tmp_path / "job"),
                     "--set", f"task.train.learner.{item}")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "job").exists()
