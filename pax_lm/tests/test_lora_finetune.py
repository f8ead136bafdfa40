"""``LORA_RANK``: an LM experiment trains low-rank adapters alone. The base weights stay
bitwise as they were, the adapters move and the loss falls, and the optimizer holds state
for the adapters only: a small fraction of full fine-tuning's."""

from __future__ import annotations

import importlib

import jax
import numpy as np
import pytest

from pax_core.testing import build_run, isolated_host, resolve

TINY = ["NUM_TRAIN_STEPS=8", "LEARNING_RATE=1e-2", "LR_SCHEDULE='constant'"]


@pytest.fixture(scope="module")
def host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")))


def _train(host, set_items: list[str], steps: int = 8):
    run = build_run(host, resolve(host, "TinyLmForTests", None, [*TINY, *set_items]),
                    jax.devices())
    step = run.compile_train_step(donate_state=False)
    batch = run.partitioner.global_batch(run.train_input.get_next())
    start = state = run.init_state()
    losses = []
    for _ in range(steps):
        state, metrics = step(state, batch)
        losses.append(float(metrics["loss"]))
    return jax.device_get(start), jax.device_get(state), losses


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
