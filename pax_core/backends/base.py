"""Per-platform runtime set-up: what must happen before JAX starts, checks after, and the
platform's choice of attention kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pax_core.backends.presets import Preset

if TYPE_CHECKING:
    import jax

# The ``jax.ad_checkpoint.checkpoint_name`` of what the attention keeps for its backward pass
# (XLA's attention: its output; Splash: its output and softmax statistics), exported from
# ``pax_core``: a remat policy that saves it keeps a fused kernel from running its forward
# pass again in the backward, and the output from being kept twice (once as a kernel's
# residual, once as the layer's context).
ATTENTION_RESIDUALS = "attention_residuals"


class Backend:
    """Base of a platform's set-up; every step does JAX's default unless a platform needs more."""

    platform = ""
    # Whether the train step reuses the old state's buffers for the new one. Accelerators need
    # it: their memory is what limits a model.
    donates_train_state = True

    def presets(self) -> list[Preset]:
        """The platform's recommended environment and flags, applied before ``prepare`` (the
        user's own values win; ``PAX_NO_PRESETS`` turns a preset off by name)."""
        return []

    def share(self, index: int, count: int) -> dict[str, str]:
        """Environment variables that give the ``index``-th of ``count`` processes started
        side by side on this host (a sweep's trials) its own share of the platform's devices;
        the default gives none, and every process sees every device."""
        del index, count
        return {}

    def prepare(self) -> None:
        """Runs before JAX initialises its runtime, after the presets: anything a preset cannot
        say (a ``jax.config`` switch)."""

    def check(self, devices: list[Any]) -> None:
        """Runs once the devices are known; raise ``UsageError`` for unusable ones."""

    def check_program(self, devices: list[Any], program: Any) -> None:
        """Runs before anything compiles, on the run's traced initialisation (``program``, a
        ``jax.extend.core.ClosedJaxpr`` holding the model's forward pass): raise ``UsageError``
        for what it computes that these devices should not run (the gpu backend refuses FP8
        on GPUs without FP8 tensor cores)."""

    def attention(self, query: jax.Array, key: jax.Array, value: jax.Array, *,
                  mask: jax.Array | None, is_causal: bool,
                  segment_ids: jax.Array | None, window: int = 0, logit_cap: float = 0.0,
                  scale: float | None = None) -> jax.Array:
        """Scaled dot-product attention, as ``pax_core.dot_product_attention`` documents; the
        default is XLA's with the full ``mask``: ``jax.nn.dot_product_attention``, or explicit
        einsums where a logit cap or a scale of its own is asked for.

        What the attention keeps for its backward pass carries the checkpoint name
        ``ATTENTION_RESIDUALS``, which remat policies save: here the output; a fused kernel's
        own residuals (its output and softmax statistics) where a backend runs one."""
        import jax
        from jax.ad_checkpoint import checkpoint_name

        from pax_core.backends.einsum import einsum_attention

        del is_causal, segment_ids, window  # all three are already in the mask
        if logit_cap or scale is not None:
            out = einsum_attention(query, key, value, mask, scale, logit_cap)
        else:
            out = jax.nn.dot_product_attention(query, key, value, mask=mask)
        return checkpoint_name(out, ATTENTION_RESIDUALS)
