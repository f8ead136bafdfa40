"""The JAX front end against librosa (the trusted reference) and its padding/masking contracts."""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_speech.layers.frontend import (
    LogMelConfig,
    frame_count,
    log_mel,
    mel_matrix,
    normalise,
    spec_augment,
)

CONFIG = LogMelConfig()
LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox/"
                "sense_and_sensibility_01_austen_64kb-0870.wav")
# Max |log-mel difference| to librosa on bins with real energy (mel > MEL_ABOVE), which is
# float32 FFT rounding: ~3e-5 on speech; the loud chirp's quiet bins reach ~6e-4, because the
# rounding scales with each frame's loudest bin.
TOLERANCE = {"librivox": 1e-4, "chirp": 1e-3}
MEL_ABOVE = 1e-4

_log_mel = jax.jit(log_mel, static_argnames="config")
# Only the mask counts are static, so the SpecAugment tests share a few compilations.
_spec_augment = jax.jit(spec_augment, static_argnames=("freq_masks", "time_masks"))
MASK_BATCH, MASK_FRAMES = 40, 2048


@pytest.fixture(scope="module")
def librosa():
    """The reference (pax-speech's ``test`` extra); only the comparisons with it need it."""
    return pytest.importorskip("librosa")


def _librosa_log_mel(librosa, audio: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same features built from librosa's STFT and filterbank: ``(log_mel, mel)``.

    librosa centres the 400-sample window inside each 512-sample FFT frame, so 56 leading zeros
    make its frame t cover our samples [160 t, 160 t + 400); the shift only changes the phase.
    """
    audio = audio.astype(np.float64)
    emphasised = np.concatenate([audio[:1], audio[1:] - CONFIG.preemphasis * audio[:-1]])
    offset = (CONFIG.fft_size - CONFIG.frame_length) // 2
    stft = librosa.stft(np.concatenate([np.zeros(offset), emphasised]), n_fft=CONFIG.fft_size,
                        hop_length=CONFIG.hop_length, win_length=CONFIG.frame_length,
                        window="hann", center=False)
    filters = librosa.filters.mel(sr=CONFIG.sample_rate, n_fft=CONFIG.fft_size,
                                  n_mels=CONFIG.num_mel_bins, fmin=CONFIG.lower_hz,
                                  fmax=CONFIG.upper_hz, htk=True, norm=None)
    mel = (filters.astype(np.float64) @ np.abs(stft) ** 2).T
    return np.log(np.maximum(mel, CONFIG.log_floor)), mel


def _chirp_and_noise(seconds: float = 3.0, seed: int = 0) -> np.ndarray:
    """A 100 Hz -> 7 kHz chirp over white noise: energy in every mel bin, no package needed."""
    t = np.arange(int(seconds * CONFIG.sample_rate)) / CONFIG.sample_rate
    chirp = 0.5 * np.sin(2 * np.pi * (100.0 * t + (7000.0 - 100.0) / (2 * seconds) * t ** 2))
    noise = 0.01 * np.random.default_rng(seed).standard_normal(t.shape)
    return (chirp + noise).astype(np.float32)


def _librivox() -> np.ndarray:
    if not LIBRIVOX.exists():
        pytest.skip(f"{LIBRIVOX} is absent (Debian's pocketsphinx test data)")
    import soundfile

    audio, sample_rate = soundfile.read(LIBRIVOX, dtype="float32")
    assert sample_rate == CONFIG.sample_rate and audio.ndim == 1
    return audio


def test_config_lengths_and_frame_count() -> None:
    assert (CONFIG.frame_length, CONFIG.hop_length) == (400, 160)
    samples = [0, 1, 399, 400, 559, 560, 16000]
    expected = [0, 0, 0, 1, 1, 2, 98]
    assert [frame_count(n, CONFIG) for n in samples] == expected
    assert all(isinstance(frame_count(n, CONFIG), int) for n in samples)
    np.testing.assert_array_equal(frame_count(np.array(samples), CONFIG), expected)
    traced = jax.jit(functools.partial(frame_count, config=CONFIG))(jnp.array(samples))
    np.testing.assert_array_equal(traced, expected)


def test_mel_matrix_matches_librosa(librosa) -> None:
    ours = mel_matrix(CONFIG)
    assert ours.shape == (CONFIG.fft_size // 2 + 1, CONFIG.num_mel_bins)
    assert ours.dtype == np.float32
    reference = librosa.filters.mel(sr=16000, n_fft=512, n_mels=80, fmin=125, fmax=7600,
                                    htk=True, norm=None)
    np.testing.assert_allclose(ours, reference.T, atol=1e-6)
    # Unnormalised triangles peak at 1 (the FFT grid may miss the apex) and none is empty.
    assert np.all(ours.max(axis=0) <= 1.0) and np.all(ours.max(axis=0) > 0.4)


@pytest.mark.parametrize("source", ["librivox", "chirp"])
def test_log_mel_matches_librosa(librosa, source: str) -> None:
    audio = _librivox() if source == "librivox" else _chirp_and_noise()
    features, frame_lengths = _log_mel(audio[None], jnp.array([audio.size]), config=CONFIG)
    assert features.dtype == jnp.float32
    assert int(frame_lengths[0]) == frame_count(audio.size, CONFIG) == features.shape[1]

    reference, mel = _librosa_log_mel(librosa, audio)
    common = min(reference.shape[0], features.shape[1])
    assert common >= features.shape[1] - 1  # librosa frames exactly the same span
    difference = np.abs(np.asarray(features[0, :common]) - reference[:common])
    energetic = mel[:common] > MEL_ABOVE
    assert energetic.mean() > 0.5
    assert difference[energetic].max() < TOLERANCE[source]
    assert difference.max() < 10 * TOLERANCE[source]  # near the floor, rounding grows in log


def test_padding_never_changes_valid_frames() -> None:
    speech = _chirp_and_noise(seconds=1.0, seed=1)
    shorter = speech[:9000]
    length = speech.size
    padded = np.zeros((2, length + 5000), np.float32)
    padded[0, :length] = speech
    padded[1, :shorter.size] = shorter
    padded[:, length:] = 7.0  # garbage in the padding must not leak in either
    padded[1, shorter.size:] = -3.0

    features, frame_lengths = _log_mel(padded, jnp.array([length, shorter.size]), config=CONFIG)
    alone, _ = _log_mel(speech[None], jnp.array([length]), config=CONFIG)
    alone_short, _ = _log_mel(shorter[None], jnp.array([shorter.size]), config=CONFIG)

    np.testing.assert_array_equal(frame_lengths, [frame_count(length, CONFIG),
                                                  frame_count(shorter.size, CONFIG)])
    assert features.shape == (2, frame_count(padded.shape[1], CONFIG), CONFIG.num_mel_bins)
    for row, reference in enumerate([alone[0], alone_short[0]]):
        valid = int(frame_lengths[row])
        np.testing.assert_allclose(features[row, :valid], reference, atol=1e-5)
        assert not np.any(np.asarray(features[row, valid:]))


def test_normalise_zero_mean_unit_variance_over_valid_frames() -> None:
    rng = np.random.default_rng(2)
    features = jnp.asarray(rng.normal(3.0, 5.0, (2, 120, 80)).astype(np.float32))
    frame_lengths = jnp.array([120, 70])
    features = jnp.where((jnp.arange(120) < frame_lengths[:, None])[..., None], features, 0.0)

    out = np.asarray(jax.jit(normalise)(features, frame_lengths))
    for row, valid in enumerate([120, 70]):
        np.testing.assert_allclose(out[row, :valid].mean(axis=0), 0.0, atol=1e-5)
        np.testing.assert_allclose(out[row, :valid].std(axis=0), 1.0, atol=1e-4)
        assert not np.any(out[row, valid:])
    constant = normalise(jnp.ones((1, 10, 4)), jnp.array([10]))
    assert np.all(np.isfinite(constant)) and not np.any(constant)


def _masks(rng: jax.Array, frame_lengths: list[int], **kwargs: float) -> np.ndarray:
    """Masked positions of an all-ones batch (padding included, to see masks stay out of it)."""
    assert len(frame_lengths) <= MASK_BATCH and max(frame_lengths) < MASK_FRAMES
    lengths = np.zeros(MASK_BATCH, np.int32)
    lengths[:len(frame_lengths)] = frame_lengths
    ones = jnp.ones((MASK_BATCH, MASK_FRAMES, CONFIG.num_mel_bins))
    masked = np.asarray(_spec_augment(rng, ones, jnp.asarray(lengths), **kwargs)) == 0.0
    return masked[:len(frame_lengths)]


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``(start, width)`` of each run of True in a 1-D mask."""
    edges = np.diff(np.concatenate([[0], mask.astype(int), [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return [(int(s), int(e - s)) for s, e in zip(starts, ends, strict=True)]


def test_spec_augment_deterministic_and_rng_dependent() -> None:
    lengths = [300, 200, 500, 50]
    first = _masks(jax.random.key(0), lengths)
    np.testing.assert_array_equal(first, _masks(jax.random.key(0), lengths))
    assert not np.array_equal(first, _masks(jax.random.key(1), lengths))
    assert first.any()


def test_spec_augment_frequency_bands_within_bounds() -> None:
    masked = _masks(jax.random.key(3), [100] * MASK_BATCH, freq_masks=1, max_freq_width=27,
                    time_masks=0)
    widths = []
    for example in masked:
        bins = example.all(axis=0)  # a frequency mask spans every frame, padding included
        np.testing.assert_array_equal(example, np.broadcast_to(bins, example.shape))
        runs = _runs(bins)
        assert len(runs) <= 1 and all(width <= 27 for _, width in runs)
        widths.append(runs[0][1] if runs else 0)
    assert max(widths) >= 20 and len(set(widths)) > 10  # widths really are drawn per example


def test_spec_augment_time_spans_inside_valid_frames() -> None:
    lengths = [1000, 400, 100, 10, 2000] * (MASK_BATCH // 5)
    masked = _masks(jax.random.key(4), lengths, freq_masks=0, time_masks=1, max_time_width=40,
                    max_time_ratio=0.05)
    widths = []
    for example, length in zip(masked, lengths, strict=True):
        frames = example.all(axis=1)
        np.testing.assert_array_equal(example, np.broadcast_to(frames[:, None], example.shape))
        runs = _runs(frames)
        assert len(runs) <= 1
        for start, width in runs:
            assert start + width <= length  # never in the padding
            assert width <= min(40, int(0.05 * length))
            widths.append(width)
    assert max(widths) >= 30


def test_spec_augment_zero_widths_is_identity() -> None:
    features = np.random.default_rng(5).normal(size=(MASK_BATCH, MASK_FRAMES, 80))
    features = jnp.asarray(features.astype(np.float32))
    lengths = jnp.arange(MASK_BATCH) * 50
    out = _spec_augment(jax.random.key(6), features, lengths, max_freq_width=0, max_time_width=0)
    np.testing.assert_array_equal(out, features)


def test_whole_front_end_under_jit() -> None:
    config = LogMelConfig(num_mel_bins=40, fft_size=1024)

    @functools.partial(jax.jit, static_argnames="config")
    def front_end(rng: jax.Array, audio: jax.Array, lengths: jax.Array,
                  config: LogMelConfig) -> tuple[jax.Array, jax.Array]:
        features, frame_lengths = log_mel(audio, lengths, config)
        return spec_augment(rng, normalise(features, frame_lengths), frame_lengths), frame_lengths

    audio = np.stack([_chirp_and_noise(1.0, seed=7), _chirp_and_noise(1.0, seed=8)])
    lengths = jnp.array([16000, 12000])
    out, frame_lengths = front_end(jax.random.key(9), audio, lengths, config=config)
    assert out.shape == (2, 98, 40) and out.dtype == jnp.float32
    np.testing.assert_array_equal(frame_lengths, [98, 73])
    assert np.all(np.isfinite(out)) and not np.any(out[1, 73:])
    assert np.any(out[1, :73] == 0.0)  # augmented
