"""Weights-only steps (``pax import``'s step 0): a checkpointer saves them from tensors that
arrive one at a time, and a restore gives them back as ``Weights``, not as a train state; a
weight format that is not installed is named in one line."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import pytest

from pax_core import Checkpointer, CheckpointSettings, Weights
from pax_core.checkpointers.orbax import OrbaxCheckpointer
from pax_core.run.state import TrainState
from pax_core.testing import run_pax

TENSORS = [(("decoder", "embedding", "table"), np.arange(12, dtype=np.float32).reshape(3, 4)),
           (("decoder", "norm", "scale"), np.full((4,), 2.0, np.float32)),
           (("head", "kernel"), np.ones((4, 3), np.float32))]


class Kept(Checkpointer):
    """A checkpointer of the interface's defaults that keeps what it is given."""

    def __init__(self):
        super().__init__("nowhere", CheckpointSettings(1, 1))
        self.saved: dict[int, Any] = {}
        self.waited = False

    def latest_step(self):
        return max(self.saved, default=None)

    def save(self, step, state, input_state):
        self.saved[step] = state
        return True

    def restore(self, step, abstract_state):
        return self.saved[step], None

    def wait(self):
        self.waited = True


def test_the_interface_gathers_the_tensors_into_weights():
    kept = Kept()
    kept.save_weights(0, iter(TENSORS))
    weights = kept.saved[0]
    assert isinstance(weights, Weights) and kept.waited
    assert weights.params["decoder"]["norm"]["scale"].tolist() == [2.0] * 4
    assert weights.params["head"]["kernel"].shape == (4, 3)


def test_orbax_streams_a_weights_step_and_restores_it_as_weights(tmp_path):
    checkpointer = OrbaxCheckpointer(str(tmp_path), CheckpointSettings(10, 3))
    checkpointer.save_weights(0, iter(TENSORS))
    assert checkpointer.all_steps() == [0]
    assert (tmp_path / "0" / "pax_checksums.json").exists()
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    params: dict[str, Any] = {}
    for path, array in TENSORS:
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = jax.ShapeDtypeStruct(array.shape, np.float32, sharding=device)
    restored, position = checkpointer.restore(0, TrainState(params, None, None, None, {}))
    checkpointer.close()
    assert isinstance(restored, Weights) and position is None
    for path, array in TENSORS:
        leaf = restored.params
        for key in path:
            leaf = leaf[key]
        np.testing.assert_array_equal(np.asarray(leaf), array)


@pytest.mark.parametrize(("plugins", "said"), [
    (None, "unknown weight_format 'nosuch'; the weight formats installed: lm/hf"),
    ("", "no weight format is installed, so none reads or writes 'nosuch'"),
])
def test_an_unknown_weight_format_is_one_line(tmp_path, plugins, said):
    selection = [] if plugins is None else ["--plugins", plugins]
    result = run_pax(*selection, "import", "nosuch", str(tmp_path), "--output",
                     str(tmp_path / "job"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert said in result.stderr
    assert not (tmp_path / "job").exists()
