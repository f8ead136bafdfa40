"""Every test sees 8 fake CPU devices: set before anything imports JAX. ``tone_data`` is a small
speech-shaped dataset any machine can write: each letter of a transcript is a tone of its own
pitch, so a recognizer can learn it and the tests need no speech synthesiser. ``demo_data`` is
``pax speech make-demo-data``'s data set, spoken once per test run where the voices are
installed; ``librispeech_standin`` a few utterances laid out as LibriSpeech is, with the
manifests its experiments read."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

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


# make-demo-data's arguments for the tests: enough utterances that every bucket of the quick
# start's experiments fills a batch; about two seconds of synthesis on two cores.
DEMO_ARGS = ("--utterances", "64", "--heldout", "8", "--seed", "7", "--jobs", "2")


@pytest.fixture(scope="session")
def demo_data() -> tuple[Path, str]:
    """The folder ``make-demo-data DEMO_ARGS`` wrote, and what the command printed.

    Spoken once per test run: into the run's cache folder (``PAX_CACHE_DIR``, which
    ``pax_core.testing`` makes for each run and every xdist worker inherits), by the first
    process that asks, under a lock the others wait on. Skipped, naming the packages, where
    the voices are not installed."""
    from typer.testing import CliRunner

    from pax_speech.commands.demo_data import PACKAGES, TOOLS, app

    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"the demo data needs {', '.join(missing)}, not found on PATH "
                    f"(apt install {PACKAGES})")
    name = "-".join(arg.lstrip("-") for arg in DEMO_ARGS)  # what decides the content
    root = Path(os.environ["PAX_CACHE_DIR"]) / f"speech-demo-{name}"
    root.mkdir(parents=True, exist_ok=True)
    folder, printed = root / "data", root / "printed.txt"
    with open(root / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
        if not printed.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a run that died before printing
            result = CliRunner().invoke(app, ["make-demo-data", str(folder), *DEMO_ARGS])
            assert result.exit_code == 0, result.output
            printed.write_text(result.output)
    return folder, printed.read_text()


# LibriSpeech's layout: SPLIT/SPEAKER/CHAPTER/SPEAKER-CHAPTER-NNNN.flac, transcripts in upper
# case with apostrophes.
LIBRISPEECH_WORDS = ("THE", "OF", "AND", "A", "TO", "IN", "HE", "WAS", "THAT", "IT'S", "HIS",
                     "HAD", "SHE", "WITH", "I'M", "YOU")


@pytest.fixture(scope="session")
def librispeech_standin(tmp_path_factory) -> Path:
    """A folder with the manifests LibriSpeech's experiments read (``train-960.jsonl``,
    ``dev-clean.jsonl``, ``dev-other.jsonl``) of 16-bit FLAC files at 16 kHz under
    ``LibriSpeech/``, 1-3 s of noise-like sound each: 16 training and 12 of each dev set."""
    import soundfile

    root = tmp_path_factory.mktemp("librispeech")
    rng = np.random.default_rng(0)
    for manifest, split, count in (("train-960", "train-clean-100", 16),
                                   ("dev-clean", "dev-clean", 12),
                                   ("dev-other", "dev-other", 12)):
        lines = []
        for i in range(count):
            speaker, chapter = 100 + i % 4, 2000 + i % 2
            audio = Path("LibriSpeech", split, str(speaker), str(chapter),
                         f"{speaker}-{chapter}-{i:04d}.flac")
            (root / audio.parent).mkdir(parents=True, exist_ok=True)
            wave = 0.1 * rng.standard_normal(int(RATE * rng.uniform(1.0, 3.0)))
            soundfile.write(root / audio, wave.astype(np.float32), RATE, subtype="PCM_16")
            text = " ".join(rng.choice(LIBRISPEECH_WORDS, size=rng.integers(3, 9)))
            lines.append(json.dumps({"audio": str(audio), "text": text,
                                     "duration": round(len(wave) / RATE, 3)}))
        (root / f"{manifest}.jsonl").write_text("\n".join(lines) + "\n")
    return root
