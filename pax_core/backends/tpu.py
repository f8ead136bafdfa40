"""The built-in backend of Cloud TPUs: Pax's recommended ``LIBTPU_INIT_ARGS``.

The flags are the ones Pax's README gives for its large LM runs (the multislice section), and
they help single-slice runs as much: windowed einsums for collective matmuls at any size, CSE of
all-gathers up to a high threshold, asynchronous all-gathers, and the latency-hiding scheduler
that overlaps collectives with compute. ``TPU_MEGACORE=MEGACORE_DENSE`` fuses the two
TensorCores of a v4 chip into one device, as Pax ran them.
"""

from __future__ import annotations

from pax_core.backends.base import Backend
from pax_core.backends.presets import Preset

PAX_TPU_FLAGS = {
    "--xla_jf_spmd_threshold_for_windowed_einsum_mib": "0",
    "--xla_tpu_spmd_threshold_for_allgather_cse": "10000",
    "--xla_enable_async_all_gather": "true",
    "--xla_tpu_enable_latency_hiding_scheduler": "true",
}


class TpuBackend(Backend):
    """Cloud TPU (libtpu, installed by ``pax-core[tpu]``)."""

    platform = "tpu"

    def presets(self) -> list[Preset]:
        return [
            Preset("pax", "Pax's libtpu flags: windowed einsums, all-gather CSE, asynchronous "
                   "all-gathers, the latency-hiding scheduler", flags=PAX_TPU_FLAGS,
                   flags_var="LIBTPU_INIT_ARGS"),
            Preset("megacore", "a v4 chip's two TensorCores as one device",
                   env={"TPU_MEGACORE": "MEGACORE_DENSE"}),
        ]
