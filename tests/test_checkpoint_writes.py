"""In one process Orbax writes each array whole, from one replica: an array replicated over
the 8 devices is not cut into a slice per replica (Orbax's replica-parallel saving, which
shares an array's writing among hosts, and in one process only adds an eager slice and a
write per replica), and it reads back exactly."""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from pax_core import CheckpointSettings
from pax_core.checkpointers.orbax import OrbaxCheckpointer
from pax_core.testing import read_params


def test_a_replicated_array_is_written_whole_by_one_process(tmp_path, monkeypatch):
    sliced = []
    original = jax.lax.slice_in_dim
    monkeypatch.setattr(jax.lax, "slice_in_dim",
                        lambda *args, **kwargs: sliced.append(args) or original(*args, **kwargs))
    replicated = NamedSharding(jax.make_mesh((8,), ("data",)), PartitionSpec())
    kernel = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    state = {"params": {"kernel": jax.device_put(kernel, replicated)}}
    checkpointer = OrbaxCheckpointer(str(tmp_path / "job" / "checkpoints"),
                                     CheckpointSettings(1, 2))
    assert checkpointer.save(1, state, {"position": 1})
    checkpointer.close()
    assert sliced == []
    np.testing.assert_array_equal(read_params(tmp_path / "job")["['kernel']"], kernel)
