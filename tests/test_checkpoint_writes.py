"""How the checkpointer writes. In one process Orbax writes each array whole, from one replica:
an array replicated over the 8 devices is not cut into a slice per replica (Orbax's
replica-parallel saving, which shares an array's writing among hosts, and in one process only
adds an eager slice and a write per replica), and it reads back exactly. A step a save in
flight finished into a job directory made again after its removal is set aside."""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from pax_core import CheckpointSettings, RunError
from pax_core.checkpointers.integrity import RECORD
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


def test_a_step_finished_into_a_job_directory_made_again_is_set_aside(tmp_path):
    # A save in flight as the job directory is removed is finished by Orbax into the directory
    # its writes make again, holding only what came after the removal, and never gets its
    # checksum record: the run's error sets it aside, so that the same command starts afresh
    # rather than refusing a directory "not written by pax train".
    root = tmp_path / "job" / "checkpoints"
    state = {"params": {"kernel": np.arange(8, dtype=np.float32)}}
    checkpointer = OrbaxCheckpointer(str(root), CheckpointSettings(1, 2))
    assert checkpointer.save(1, state, {"position": 1})
    checkpointer.wait()
    shutil.move(tmp_path / "job", tmp_path / "gone")
    root.mkdir(parents=True)
    shutil.copytree(tmp_path / "gone" / "checkpoints" / "1", root / "2")
    (root / "2" / RECORD).unlink()
    with pytest.raises(RunError) as failed:
        checkpointer.save(3, state, {"position": 3})
    assert (f"(No such file or directory); no complete checkpoint is left (step 2, written as "
            f"the directory went, is set aside in {tmp_path / 'job' / 'unverified_checkpoints'})"
            in str(failed.value)), failed.value
    assert not any(path.name.isdigit() for path in root.iterdir())
    assert [p.name.split("-")[0] for p in (tmp_path / "job" / "unverified_checkpoints").iterdir()
            ] == ["2"]
