"""``pax speech make-demo-data``: a small speech data set made on this machine, no download.

Sentences come from a small seeded grammar (playing cards, digit strings, numbers, spoken
commands: 64 words), so that a model can learn them in minutes and its mistakes can be
read. They are spoken by flite's voices and espeak-ng's, each utterance with its own speed and
pitch, and stored by sox as 16 kHz mono 16-bit WAV. The held-out set holds sentences that the
training set does not, made of its words (the same grammar and voice mix: it measures
generalisation to new word sequences, not to new speakers), and ``real.jsonl`` the recordings
of people that Debian's pocketsphinx-testdata ships (read English from LibriVox and spoken
cards), copied in so the folder is self-contained. Everything is decided by the seed before
synthesis starts, so a seed gives the same sentences and voices (and, with the same tool
versions, the same files).
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated

import soundfile
import typer

from pax_core import RunError, UsageError
from pax_speech import vocab

TOOLS = ("flite", "espeak-ng", "sox")
PACKAGES = "flite espeak-ng sox pocketsphinx-testdata"
TESTDATA = Path("/usr/share/pocketsphinx/test/data")
SAMPLE_RATE = 16000

RANKS = ("ace", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "jack",
         "queen", "king")
SUITS = ("hearts", "spades", "clubs", "diamonds")
DIGITS = ("zero", "oh", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
        "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
        "eighteen", "nineteen")
TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
# A command and the unit of the number it takes ("" when it takes none).
COMMANDS = (("go forward", "meter"), ("go back", "meter"), ("move left", "step"),
            ("move right", "step"), ("turn left", "degree"), ("turn right", "degree"),
            ("wait", "second"), ("turn left", ""), ("turn right", ""), ("turn around", ""),
            ("stop", ""), ("start", ""), ("go up", ""), ("go down", ""), ("slow down", ""),
            ("speed up", ""))


def number_words(n: int) -> str:
    """``n`` (0..999) in words: "one hundred and five", "twenty three"."""
    hundreds, rest = divmod(n, 100)
    head = f"{ONES[hundreds]} hundred" if hundreds else ""
    if not rest:
        return head or "zero"
    tail = ONES[rest] if rest < 20 else " ".join(
        w for w in (TENS[rest // 10], ONES[rest % 10] if rest % 10 else "") if w)
    return f"{head} and {tail}" if head else tail


def _cards(rng: random.Random) -> str:
    count = rng.choice((1, 1, 2, 3))
    return " ".join(f"{rng.choice(RANKS)} of {rng.choice(SUITS)}" for _ in range(count))


def _digits(rng: random.Random) -> str:
    return " ".join(rng.choice(DIGITS) for _ in range(rng.randint(2, 6)))


def _number(rng: random.Random) -> str:
    return number_words(rng.choice((rng.randint(0, 99), rng.randint(100, 999))))


def _command(rng: random.Random) -> str:
    verb, unit = rng.choice(COMMANDS)
    if not unit:
        return f"please {verb}" if rng.random() < 0.2 else verb
    n = rng.randint(1, 90)
    return f"{verb} {number_words(n)} {unit}{'' if n == 1 else 's'}"


GRAMMAR = ((_cards, 3), (_digits, 2), (_number, 2), (_command, 3))


def sentences(utterances: int, heldout: int, seed: int) -> tuple[list[str], list[str]]:
    """The training sentences, drawn freely (several voices may say one sentence, as in read
    speech corpora), and ``heldout`` distinct sentences that are not among them and whose
    words all are (a held-out error is then a word sequence the model has not heard, never a
    word it cannot know)."""
    rng = random.Random(seed)
    train = [_sentence(rng) for _ in range(utterances)]
    seen, words, held = set(train), {w for t in train for w in t.split()}, {}
    for _ in range(1000 * heldout):
        if len(held) == heldout:
            break
        text = _sentence(rng)
        if text not in seen and words.issuperset(text.split()):
            held.setdefault(text, None)
    if len(held) < heldout:
        raise UsageError(f"the demo grammar has too few sentences unseen in {utterances} "
                         f"training utterances for {heldout} held-out ones; ask for fewer")
    return train, list(held)


def _sentence(rng: random.Random) -> str:
    makers, weights = zip(*GRAMMAR, strict=True)
    return rng.choices(makers, weights)[0](rng)


def vocabulary() -> set[str]:
    """Every word the grammar can say."""
    words = {*RANKS, *SUITS, *DIGITS, *ONES, *TENS, "of", "hundred", "and", "please"}
    for verb, unit in COMMANDS:
        words |= {*verb.split(), unit, f"{unit}s"}
    return words - {"", "s"}


@dataclasses.dataclass(frozen=True)
class Voice:
    """A synthesiser, its voice and the speed and pitch of one utterance."""

    tool: str  # flite or espeak-ng
    name: str
    speed: float  # flite: duration_stretch; espeak-ng: words per minute
    pitch: float  # flite: int_f0_target_mean (Hz); espeak-ng: pitch 0..99

    def command(self, text: str, out: str) -> list[str]:
        if self.tool == "flite":
            return ["flite", "-voice", self.name, "--setf", f"duration_stretch={self.speed}",
                    "--setf", f"int_f0_target_mean={self.pitch}", "-t", text, "-o", out]
        return ["espeak-ng", "-v", self.name, "-s", str(round(self.speed)), "-p",
                str(round(self.pitch)), "-w", out, text]

    def __str__(self) -> str:
        return f"{self.tool} {self.name}"


# (tool, voice, lowest and highest pitch): flite's mean F0 in Hz, espeak-ng's pitch setting.
VOICES = (("flite", "slt", 150, 210), ("flite", "rms", 85, 130), ("flite", "awb", 85, 130),
          ("flite", "kal16", 85, 130), ("espeak-ng", "en-us", 30, 70),
          ("espeak-ng", "en-gb", 30, 70), ("espeak-ng", "en-us+f3", 40, 75),
          ("espeak-ng", "en-gb+m3", 25, 60))


def draw_voice(rng: random.Random) -> Voice:
    """A voice of ``VOICES`` with a speed and pitch of its own."""
    tool, name, low, high = rng.choice(VOICES)
    speed = round(rng.uniform(0.8, 1.3), 2) if tool == "flite" else rng.randint(130, 190)
    return Voice(tool, name, speed, rng.randint(low, high))


def _synthesise(job: tuple[str, Voice, Path]) -> float:
    """Speak ``text`` into the WAV file ``out`` (16 kHz mono 16-bit, level-normalised, with a
    little silence around); its seconds."""
    text, voice, out = job
    with tempfile.TemporaryDirectory() as scratch:
        raw = f"{scratch}/raw.wav"
        _run(voice.command(text, raw))
        _run(["sox", raw, "-r", str(SAMPLE_RATE), "-c", "1", "-b", "16", str(out),
              "gain", "-n", "-3", "pad", "0.1", "0.1"])
    return soundfile.info(str(out)).duration


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise RunError(f"{command[0]} failed ({' '.join(command[:3])} ...): {why}")


def _write_set(root: Path, split: str, texts: list[str], voices: list[Voice],
               pool: ThreadPoolExecutor) -> float:
    """Synthesise a split into ``root/audio/split`` and write ``root/split.jsonl``; the
    seconds of audio."""
    folder = root / "audio" / split
    folder.mkdir(parents=True)
    paths = [folder / f"{i:05d}.wav" for i in range(len(texts))]
    seconds = list(pool.map(_synthesise, zip(texts, voices, paths, strict=True)))
    lines = [{"audio": str(p.relative_to(root)), "text": t, "duration": round(s, 3),
              "voice": str(v)} for p, t, s, v in zip(paths, texts, seconds, voices, strict=True)]
    _write_jsonl(root / f"{split}.jsonl", lines)
    return sum(seconds)


def _write_jsonl(path: Path, lines: list[dict]) -> None:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")


_TRANSCRIPT = re.compile(r"^<s>\s*(.*?)\s*</s>\s*\((\S+)\)\s*$")


def copy_real(root: Path, testdata: Path) -> tuple[int, float]:
    """Copy pocketsphinx-testdata's recordings into ``root/real`` and write
    ``root/real.jsonl``; (utterances, seconds), (0, 0) when the package is absent."""
    sets = (("librivox", "transcription"), ("cards", "cards.transcription"))
    if not all((testdata / folder / name).is_file() for folder, name in sets):
        return 0, 0.0
    lines = []
    for folder, name in sets:
        (root / "real" / folder).mkdir(parents=True)
        for raw in (testdata / folder / name).read_text().splitlines():
            match = _TRANSCRIPT.match(raw.strip())
            if match:
                target = root / "real" / folder / f"{match[2]}.wav"
                shutil.copyfile(testdata / folder / f"{match[2]}.wav", target)
                lines.append({"audio": str(target.relative_to(root)),
                              "text": vocab.normalise(match[1]),
                              "duration": round(soundfile.info(str(target)).duration, 3)})
    _write_jsonl(root / "real.jsonl", lines)
    return len(lines), sum(line["duration"] for line in lines)


def check_output(output_dir: Path) -> None:
    """``UsageError`` unless the data set can be written to ``output_dir``: a new or empty
    folder whose nearest existing ancestor is a folder this user may write in (the data set is
    made beside it and renamed into place)."""
    if output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
        raise UsageError(f"{output_dir} exists and is not an empty folder; give a new folder "
                         f"(nothing was written)")
    above = next(p for p in output_dir.absolute().parents if p.exists())
    if not above.is_dir():
        raise UsageError(f"{output_dir} is inside {above}, which is a file, not a folder; give "
                         f"a folder path (nothing was written)")
    if not os.access(above, os.W_OK | os.X_OK):
        raise UsageError(f"cannot write in {above} (permission denied); give a folder you "
                         f"can write in (nothing was written)")


def make_demo_data(output_dir: Path, utterances: int = 1600, heldout: int = 100, seed: int = 0,
                   jobs: int = 2, testdata: Path = TESTDATA) -> str:
    """Write the demo data set into ``output_dir`` (absent or empty); the summary line.
    ``UsageError`` for an output it cannot write, bad counts or a missing tool, in that order:
    what the command line says is checked before the machine, so a mistyped folder is named
    as such on a machine without the voices too."""
    check_output(output_dir)
    if utterances < 1 or heldout < 0 or jobs < 1:
        raise UsageError(f"--utterances and --jobs must be >= 1 and --heldout >= 0, got "
                         f"{utterances}, {jobs} and {heldout}")
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        raise UsageError(f"make-demo-data needs {', '.join(missing)}, not found on PATH; "
                         f"install them: apt install {PACKAGES}")
    start = time.monotonic()
    train, held = sentences(utterances, heldout, seed)
    voice_rng = random.Random(f"{seed}/voices")
    voices = [draw_voice(voice_rng) for _ in train + held]
    # Written beside the output and renamed at the end, so an interrupted run leaves no
    # half-made data set where the quick start would read it.
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.partial-",
                                    dir=output_dir.parent))
    partial.chmod(0o755)  # mkdtemp's is private
    try:
        with ThreadPoolExecutor(jobs) as pool:  # each thread waits on its own synthesiser
            seconds = _write_set(partial, "train", train, voices[:utterances], pool)
            seconds += _write_set(partial, "heldout", held, voices[utterances:], pool)
        real, real_seconds = copy_real(partial, testdata)
        if output_dir.exists():
            output_dir.rmdir()  # empty, checked above
        partial.rename(output_dir)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    counts = (f"{utterances} training, {heldout} held-out and {real} real" if real else
              f"{utterances} training and {heldout} held-out")
    summary = (f"wrote {counts} utterances ({(seconds + real_seconds) / 3600:.2f} hours of "
               f"audio, {len(vocabulary())} words) to {output_dir} in "
               f"{time.monotonic() - start:.0f} s")
    if not real:
        summary += (f"; real.jsonl skipped: no recordings in {testdata} (they come with the "
                    f"Debian package pocketsphinx-testdata: apt install pocketsphinx-testdata)")
    return summary


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
                  no_args_is_help=True)


@app.callback()
def speech() -> None:
    """Speech data tools."""


@app.command("make-demo-data")
def make_demo_data_command(
    output_dir: Annotated[Path, typer.Argument(help="A new (or empty) folder to write into.")],
    utterances: Annotated[int, typer.Option(help="Training utterances to synthesise.")] = 1600,
    heldout: Annotated[int, typer.Option(help="Held-out utterances (unseen sentences).")] = 100,
    seed: Annotated[int, typer.Option(help="Decides the sentences and voices.")] = 0,
    jobs: Annotated[int, typer.Option(help="Synthesiser processes run at once.")] = 2,
) -> None:
    """Write a small speech data set without a download: train.jsonl and heldout.jsonl of
    sentences (cards, digits, numbers, commands) spoken by flite and espeak-ng voices, and
    real.jsonl of pocketsphinx-testdata's recordings, with their 16 kHz WAV files."""
    typer.echo(make_demo_data(output_dir, utterances, heldout, seed, jobs))
