"""The speech-recognition task: waveforms to log-mel features, a Conformer encoder, a CTC head
over characters, ``optax.ctc_loss``, and greedy decoding with word and character error rates
in evaluation.

Waveforms cross from the input as float32 ``audio [B, S]`` with ``audio_length`` (samples), the
transcripts as ``text [B, L]`` label ids with ``text_length``; ``weight`` per utterance leaves
an eval batch's padding rows out of every metric. The front end runs on the device, inside the
step: one program from samples to loss, and SpecAugment drawn fresh each step.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from pax_core import ModelOutput, UsageError, axes
from pax_speech import decoding
from pax_speech.layers import frontend
from pax_speech.layers.conformer import ConformerConfig, ConformerEncoder, subsampled_lengths
from pax_speech.layers.norm import SPEECH_MOMENTUM
from pax_speech.vocab import BLANK, ENGLISH
from pax_transformer import BatchNorm

FLOPS_FORMULA = "conformer-ctc-v1"
NORMALISATIONS = ("utterance", "global")


@dataclasses.dataclass(frozen=True)
class SpecAugment:
    """SpecAugment's masks (Park et al. 2019; the defaults are its LibriSpeech policy): per
    utterance, ``freq_masks`` bands up to ``max_freq_width`` bins and ``time_masks`` spans up to
    ``max_time_width`` frames and ``max_time_ratio`` of the utterance."""

    freq_masks: int = 2
    max_freq_width: int = 27
    time_masks: int = 2
    max_time_width: int = 40
    max_time_ratio: float = 0.05


class CtcRecognizer(nn.Module):
    """Log-mel features (``features``), normalised per utterance or by global statistics
    (``normalisation``: ``"global"`` keeps their moving averages in ``batch_stats``), masked
    by ``spec_augment`` in training, encoded by a Conformer and classified per frame into
    ``alphabet``'s characters and CTC's blank."""

    encoder: ConformerConfig = ConformerConfig()
    features: frontend.LogMelConfig = frontend.LogMelConfig()
    normalisation: str = "utterance"
    spec_augment: SpecAugment | None = SpecAugment()
    alphabet: str = ENGLISH

    flops_formula = FLOPS_FORMULA

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet) + 1

    @nn.nowrap
    def flops_per_step(self, batch_spec: dict[str, Any]) -> float:
        """Training FLOPs of a batch: 3 x the forward matmuls (subsampling, every block, the
        CTC head) at the batch's padded length; the front end's FFT is left out."""
        batch, samples = batch_spec["audio"].shape
        frames = int(subsampled_lengths(frontend.frame_count(samples, self.features)))
        per_frame = self.encoder.forward_flops_per_frame(frames, self.features.num_mel_bins)
        head = 2 * self.encoder.model_dims * self.vocab_size
        return 3.0 * batch * frames * (per_frame + head)

    @nn.compact
    def encode(self, audio: jax.Array, audio_length: jax.Array,
               train: bool) -> tuple[jax.Array, jax.Array]:
        """CTC logits ``[B, T', V]`` (float32) of waveforms, and each utterance's valid T'."""
        features, frames = frontend.log_mel(audio, audio_length, self.features)
        mask = jnp.arange(features.shape[1])[None, :] < frames[:, None]
        if self.normalisation == "utterance":
            features = frontend.normalise(features, frames)
        elif self.normalisation == "global":
            features = BatchNorm(momentum=SPEECH_MOMENTUM, affine=False, channel_axis=axes.EMBED,
                                 name="feature_norm")(features, train, mask)
            features = features * mask[..., None]
        else:
            raise UsageError(f"NORMALISATION must be one of {', '.join(NORMALISATIONS)}, got "
                             f"{self.normalisation!r}")
        if train and self.spec_augment is not None:
            features = frontend.spec_augment(self.make_rng("dropout"), features, frames,
                                             **dataclasses.asdict(self.spec_augment))
        features = nn.with_logical_constraint(features, (axes.BATCH, axes.LENGTH, None))
        encoded, mask = ConformerEncoder(self.encoder, train, name="encoder")(features, mask)
        # A few dozen characters: the head is too small to be worth sharding.
        logits = nn.Dense(self.vocab_size, name="head", dtype=self.encoder.dtype,
                          kernel_init=nn.with_logical_partitioning(
                              nn.initializers.variance_scaling(1.0, "fan_in", "normal"),
                              (axes.EMBED, None)),
                          bias_init=nn.with_logical_partitioning(nn.initializers.zeros,
                                                                 (None,)))(encoded)
        logits = nn.with_logical_constraint(logits.astype(jnp.float32),
                                            (axes.BATCH, axes.LENGTH, None))
        return logits, subsampled_lengths(frames)

    def __call__(self, batch: dict[str, Any], train: bool = False) -> ModelOutput:
        logits, lengths = self.encode(batch["audio"], batch["audio_length"], train)
        text, text_length = batch["text"], batch["text_length"]
        weights = batch.get("weight")
        if weights is None:
            weights = jnp.ones(text_length.shape, jnp.float32)
        frame_paddings = (jnp.arange(logits.shape[1])[None, :] >= lengths[:, None])
        label_paddings = (jnp.arange(text.shape[1])[None, :] >= text_length[:, None])
        per_utterance = optax.ctc_loss(logits, frame_paddings.astype(jnp.float32), text,
                                       label_paddings.astype(jnp.float32), blank_id=BLANK)
        # An utterance too short for its transcript (CTC needs a frame per label and one more
        # between repeated labels) has no alignment: it is counted, and left out of the loss
        # rather than swamping it.
        repeats = jnp.sum((text[:, 1:] == text[:, :-1]) & ~label_paddings[:, 1:], axis=1)
        feasible = (lengths >= text_length + repeats).astype(jnp.float32) * weights
        total = jnp.maximum(jnp.sum(feasible), 1.0)
        kept = jnp.where(feasible > 0, per_utterance, 0.0)
        loss = jnp.sum(kept * feasible) / total
        chars = text_length.astype(jnp.float32) * feasible
        metrics = {
            "ctc_loss": (kept, feasible),
            "ctc_loss_per_char": (kept / jnp.maximum(text_length, 1), chars),
            "num_utterances": (jnp.sum(weights), None),
            "num_unalignable": (jnp.sum((1 - feasible) * weights), None),
        }
        if not train:
            metrics.update(self.error_rates(logits, lengths, text, text_length, weights))
        return ModelOutput(loss=loss, metrics=metrics)

    @nn.nowrap
    def error_rates(self, logits: jax.Array, lengths: jax.Array, text: jax.Array,
                    text_length: jax.Array, weights: jax.Array) -> dict[str, tuple[Any, Any]]:
        """``cer`` and ``wer`` of the greedy transcripts, weighted by reference characters and
        words (so they average over the eval set's characters and words, as error rates do)."""
        hyp, hyp_length = decoding.greedy_decode(logits, lengths)
        counts = decoding.error_counts(hyp, hyp_length, text, text_length,
                                       space=self.alphabet.index(" ") + 1)
        chars, words = counts["chars"] * weights, counts["words"] * weights
        return {"cer": (counts["char_edits"] / jnp.maximum(counts["chars"], 1.0), chars),
                "wer": (counts["word_edits"] / jnp.maximum(counts["words"], 1.0), words)}

    def transcribe(self, audio: jax.Array, audio_length: jax.Array) -> tuple[jax.Array,
                                                                               jax.Array]:
        """Per-frame log-probabilities ``[B, T', V]`` of waveforms, and their valid T'."""
        logits, lengths = self.encode(audio, audio_length, False)
        return jax.nn.log_softmax(logits, axis=-1), lengths
