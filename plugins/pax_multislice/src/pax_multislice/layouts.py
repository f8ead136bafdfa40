"""The multi-slice mesh layout: devices grouped into slices the way JAX groups them, and the
TPU runtime's megascale settings for a run over several slices.

Slices are found as ``jax.experimental.mesh_utils.create_hybrid_device_mesh`` finds them: by
each device's ``slice_index`` on TPUs; where every device reports the same slice (CPU and other
hosts without slice information) each process is one slice, or, with more processes than
slices, consecutive processes form a slice (the hosts of a TPU slice, as ``pax launch --tpu``
numbers them); in a single process, consecutive runs of devices stand in for slices, so that a
one-process run can be compared with the multi-process one. Inside a slice,
``create_device_mesh`` orders the devices along the chips' physical links, and every mesh axis
is (DCN part) x (ICI part), so collectives over the ICI part of an axis never leave a slice.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from jax.experimental import mesh_utils

from pax_core import DistributedOptions, MeshLayout, Preset, UsageError

# The port libtpu's megascale runtime listens on, by convention across Google's TPU tools.
MEGASCALE_PORT = "8080"

# Data parallelism over DCN: an all-reduce of gradients crossing slices, optimised and
# overlapped with compute (the flags MaxText recommends for DCN data parallelism).
DCN_DATA_PARALLEL_FLAGS = {
    "--xla_tpu_enable_data_parallel_all_reduce_opt": "true",
    "--xla_tpu_data_parallel_opt_different_sized_ops": "true",
}
ASYNC_COLLECTIVE_FLAGS = {
    "--xla_tpu_enable_async_collective_fusion": "true",
    "--xla_tpu_enable_async_collective_fusion_fuse_all_gather": "true",
    "--xla_tpu_enable_async_collective_fusion_multiple_steps": "true",
    "--xla_tpu_overlap_compute_collective_tc": "true",
}


def megascale_env(slices: int, processes: DistributedOptions) -> dict[str, str]:
    """The megascale variables libtpu reads to join slices over DCN. The slice count always;
    the coordinator and this process's slice only when the run was told how processes join
    (``--coordinator-address`` and friends, or ``pax launch``), since Cloud TPU's queued
    resources set them otherwise."""
    env = {"MEGASCALE_NUM_SLICES": str(slices)}
    known = processes.coordinator_address and processes.num_processes is not None
    if known and processes.process_id is not None and processes.num_processes % slices == 0:
        host = processes.coordinator_address.rpartition(":")[0]
        per_slice = processes.num_processes // slices
        env |= {"MEGASCALE_COORDINATOR_ADDRESS": f"{host}:{MEGASCALE_PORT}",
                "MEGASCALE_PORT": MEGASCALE_PORT,
                "MEGASCALE_SLICE_ID": str(processes.process_id // per_slice)}
    return env


def slice_groups(devices: Sequence[Any], slices: int) -> tuple[list[list[Any]], str]:
    """The devices of each slice, in slice order, and what the slices were found by."""
    by_slice: dict[int, list[Any]] = {}
    for d in devices:
        by_slice.setdefault(getattr(d, "slice_index", 0), []).append(d)
    found = "slice_index"
    if len(by_slice) == 1:
        by_slice, found = {}, "process"
        for d in devices:
            by_slice.setdefault(d.process_index, []).append(d)
    if found == "process" and len(by_slice) > slices > 1 and len(by_slice) % slices == 0:
        # several processes (hosts) a slice, consecutive ones together, as on TPU slices
        per_slice = len(by_slice) // slices
        found = f"processes ({per_slice} a slice)"
        processes = sorted(by_slice)
        by_slice = {i: [d for p in processes[i * per_slice:(i + 1) * per_slice]
                        for d in by_slice[p]] for i in range(slices)}
    if len(by_slice) == 1 and slices > 1 and len(devices) % slices == 0:
        size, found = len(devices) // slices, "consecutive devices (one process)"
        by_slice = {i: list(devices[i * size:(i + 1) * size]) for i in range(slices)}
    return [by_slice[k] for k in sorted(by_slice)], found


class MultisliceLayout(MeshLayout):
    """ICI x DCN meshes over slices; megascale and DCN presets for the TPU runtime."""

    def presets(self, dcn: Sequence[int], processes: DistributedOptions) -> list[Preset]:
        slices = math.prod(dcn)
        if slices == 1:
            return []
        return [
            Preset("megascale", "libtpu's slice count, coordinator and this process's slice",
                   env=megascale_env(slices, processes)),
            Preset("dcn-data-parallel", "the gradient all-reduce across slices optimised",
                   flags=DCN_DATA_PARALLEL_FLAGS, flags_var="LIBTPU_INIT_ARGS"),
            Preset("async-collectives", "collectives fused and overlapped with compute",
                   flags=ASYNC_COLLECTIVE_FLAGS, flags_var="LIBTPU_INIT_ARGS"),
        ]

    def device_grid(self, devices: Sequence[Any], ici: Sequence[int], dcn: Sequence[int]
                    ) -> np.ndarray:
        slices = math.prod(dcn)
        groups, found = slice_groups(devices, slices)
        sizes = {len(g) for g in groups}
        if len(groups) != slices or sizes != {math.prod(ici)}:
            raise UsageError(
                f"DCN_MESH_SHAPE {list(dcn)} asks for {slices} slices of {math.prod(ici)} "
                f"devices (ICI_MESH_SHAPE {list(ici)}), but the {len(devices)} devices form "
                f"{len(groups)} slice(s) of {'/'.join(map(str, sorted(sizes)))} by {found}; "
                f"change the two shapes to match the slices")
        if found in ("slice_index", "process"):
            return mesh_utils.create_hybrid_device_mesh(
                ici, dcn, devices, process_is_granule=found == "process",
                allow_split_physical_axes=True)
        ordered = [d for g in groups for d in
                   mesh_utils.create_device_mesh(ici, g, allow_split_physical_axes=True).flat]
        return super().device_grid(ordered, ici, dcn)
