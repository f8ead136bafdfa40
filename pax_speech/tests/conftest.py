"""Every test sees 8 fake CPU devices: set before anything imports JAX. ``tone_data`` is a small
speech-shaped dataset any machine can write: each letter of a transcript is a tone of its own
pitch, so a recognizer can learn it and the tests need no speech synthesiser."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pax_core.testing import use_cpu_devices

use_cpu_devices(8)

RATE = 16000
LETTERS = "abcdefgh"
WORDS = ("abc", "de", "fgh", "ha", "bad", "cafe")


def write_tone_manifest(folder, name: str, count: int, seed: int) -> str:
    """``count`` WAVs of transcripts of 1-3 words, 0.08 s of a letter's tone per letter and
    0.08 s of silence per space, and the manifest ``folder/name.jsonl`` listing them."""
    import soundfile

    rng = np.random.default_rng(seed)
    audio_dir = folder / name
    audio_dir.mkdir(parents=True, exist_ok=True)
    lines = []
    for i in range(count):
        text = " ".join(rng.choice(WORDS, size=rng.integers(1, 4)))
        pieces = [np.zeros(800)]
        for c in text:
            t = np.arange(int(0.08 * RATE)) / RATE
            pitch = 300.0 + 150.0 * LETTERS.index(c) if c != " " else 0.0
            pieces.append(0.3 * np.sin(2 * np.pi * pitch * t) if pitch else np.zeros(len(t)))
        wave = np.concatenate(pieces) + 0.003 * rng.normal(size=sum(map(len, pieces)))
        path = audio_dir / f"{i:03d}.wav"
        soundfile.write(path, wave.astype(np.float32), RATE, subtype="PCM_16")
        lines.append(json.dumps({"audio": f"{name}/{i:03d}.wav", "text": text}))
    manifest = folder / f"{name}.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    return str(manifest)


@pytest.fixture(scope="session")
def tone_data(tmp_path_factory):
    """A folder with ``train.jsonl`` (64 utterances) and ``heldout.jsonl`` (16)."""
    folder = tmp_path_factory.mktemp("tones")
    write_tone_manifest(folder, "train", 64, seed=0)
    write_tone_manifest(folder, "heldout", 16, seed=1)
    return folder
