"""Reading audio files: what every speech input and command reads sound with.

Files are read with soundfile (libsndfile: WAV, FLAC and the other formats it knows), as
float32 in [-1, 1], mono by averaging the channels (a stereo recording of one speaker holds the
same speech twice). A file of another sample rate is brought to the wanted one with
``scipy.signal.resample_poly`` (polyphase filtering: exact ratios, no aliasing) unless the
caller asked to refuse it. A file that cannot be read raises ``BadAudio``, which names it, so a
caller can turn it into its own one-line message.
"""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import soundfile

ON_OTHER_RATE = ("resample", "refuse")


class BadAudio(Exception):
    """A file that cannot be read as audio; ``where`` names it, ``reason`` says why."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


@dataclasses.dataclass(frozen=True)
class AudioInfo:
    """What a file's header says: its sample rate, length and channel count."""

    sample_rate: int
    frames: int
    channels: int

    def samples_at(self, sample_rate: int) -> int:
        """The length in samples once resampled to ``sample_rate``."""
        return resampled_length(self.frames, self.sample_rate, sample_rate)


def audio_info(path: str) -> AudioInfo:
    """The header of ``path``, read without decoding the audio; ``BadAudio`` when the file is
    absent, not audio, or holds no samples."""
    if not os.path.isfile(path):
        raise BadAudio(path, "no such file")
    try:
        info = soundfile.info(path)
    except (soundfile.SoundFileError, RuntimeError) as e:
        raise BadAudio(path, f"not a readable audio file (WAV, FLAC): {_reason(e)}") from None
    if info.frames <= 0:
        raise BadAudio(path, "holds no samples")
    return AudioInfo(int(info.samplerate), int(info.frames), int(info.channels))


def read_audio(path: str, sample_rate: int, on_other_rate: str = "resample") -> np.ndarray:
    """The samples of ``path`` as float32 ``[samples]`` in [-1, 1], mono, at ``sample_rate``.

    ``on_other_rate``: ``"resample"`` brings a file of another rate to ``sample_rate``;
    ``"refuse"`` raises ``BadAudio`` for it instead. ``BadAudio`` also for a file that is
    absent, not audio, or whose data cannot be decoded in full (a damaged or truncated file:
    the decoded length must be the header's).
    """
    if on_other_rate not in ON_OTHER_RATE:
        raise ValueError(f"on_other_rate must be one of {', '.join(ON_OTHER_RATE)}, got "
                         f"{on_other_rate!r}")
    if not os.path.isfile(path):
        raise BadAudio(path, "no such file")
    try:
        with soundfile.SoundFile(path) as f:
            rate, frames = int(f.samplerate), int(f.frames)
            data = f.read(dtype="float32", always_2d=True)
    except (soundfile.SoundFileError, RuntimeError) as e:
        raise BadAudio(path, f"cannot decode the audio: {_reason(e)}") from None
    if len(data) != frames or not frames:
        raise BadAudio(path, f"decoded {len(data)} samples but the header says {frames}: the "
                             f"file is truncated or damaged")
    mono = data.mean(axis=1, dtype=np.float32) if data.shape[1] > 1 else data[:, 0]
    if rate == sample_rate:
        return mono
    if on_other_rate == "refuse":
        raise BadAudio(path, f"sampled at {rate} Hz, not {sample_rate} Hz")
    return resample(mono, rate, sample_rate)


def resample(audio: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """``audio`` (float32 ``[samples]``) resampled from ``from_rate`` to ``to_rate``; its
    length is ``resampled_length``."""
    from scipy.signal import resample_poly

    g = math.gcd(from_rate, to_rate)
    out = resample_poly(audio, to_rate // g, from_rate // g)
    return np.clip(out, -1.0, 1.0).astype(np.float32)


def resampled_length(frames: int, from_rate: int, to_rate: int) -> int:
    """How many samples ``frames`` at ``from_rate`` become at ``to_rate`` (resample_poly's
    count: the ceiling of ``frames * to_rate / from_rate``)."""
    return -(-frames * to_rate // from_rate)


def _reason(error: Exception) -> str:
    """libsndfile's reason, without the path it repeats."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    return text.split(": ", 1)[-1] if text.startswith("Error opening") else text
