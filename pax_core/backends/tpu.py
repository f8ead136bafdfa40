"""The built-in backend of Cloud TPUs: Pax's recommended ``LIBTPU_INIT_ARGS``, and Splash
attention (``pax_core.backends.splash``) wherever it applies, XLA's elsewhere (said once per
reason).

The flags are the ones Pax's README gives for its large LM runs (the multislice section), and
they help single-slice runs as much: windowed einsums for collective matmuls at any size, CSE of
all-gathers up to a high threshold, asynchronous all-gathers, and the latency-hiding scheduler
that overlaps collectives with compute. ``TPU_MEGACORE=MEGACORE_DENSE`` fuses the two
TensorCores of a v4 chip into one device, as Pax ran them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pax_core.backends.base import Backend
from pax_core.backends.presets import Preset
from pax_core.errors import warn

if TYPE_CHECKING:
    import jax

PAX_TPU_FLAGS = {
    "--xla_jf_spmd_threshold_for_windowed_einsum_mib": "0",
    "--xla_tpu_spmd_threshold_for_allgather_cse": "10000",
    "--xla_enable_async_all_gather": "true",
    "--xla_tpu_enable_latency_hiding_scheduler": "true",
}
_told: set[str] = set()


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

    def attention(self, query: jax.Array, key: jax.Array, value: jax.Array, *,
                  mask: jax.Array | None, is_causal: bool, segment_ids: jax.Array | None,
                  window: int = 0, logit_cap: float = 0.0, scale: float | None = None
                  ) -> jax.Array:
        from pax_core.backends.splash import splash_attention, splash_unsupported

        reason = splash_unsupported(query, key, mask=mask, is_causal=is_causal,
                                    segment_ids=segment_ids)
        if reason is None:
            return splash_attention(query, key, value, is_causal=is_causal,
                                    segment_ids=segment_ids, window=window,
                                    logit_cap=logit_cap, scale=scale)
        if reason not in _told:
            _told.add(reason)
            warn(f"attention runs on XLA, not Splash, for {reason}")
        return super().attention(query, key, value, mask=mask, is_causal=is_causal,
                                 segment_ids=segment_ids, window=window, logit_cap=logit_cap,
                                 scale=scale)
