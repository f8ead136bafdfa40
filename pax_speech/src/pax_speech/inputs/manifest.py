"""Speech data as a JSONL manifest, and ``ManifestInput``: its batches on grain.

A manifest holds one utterance a line: ``{"audio": PATH, "text": STR, "duration": SECONDS}``
(``duration`` optional; other keys are ignored). A relative ``audio`` path is relative to the
manifest's folder, so a data folder can move as a whole. Transcripts are normalised as the
vocabulary looks them up (lower case, single spaces).

Lengths come from the audio files' headers, never from ``duration``: the files are what is
decoded, and a manifest written for other files (or by hand) would put utterances in buckets
they do not fit. Reading the headers is cheap (no decoding; a thread pool for big manifests),
so the whole manifest is checked before a run writes anything, each problem reported as one
line naming the manifest, the line and what to do.
"""

from __future__ import annotations

import dataclasses
import json
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from pax_core import IndexedInput, UsageError, fingerprint, warn
from pax_speech import vocab
from pax_speech.inputs.audio import ON_OTHER_RATE, AudioInfo, BadAudio, audio_info, read_audio
from pax_speech.inputs.buckets import PADDING, EvalPlan, TrainingPlan, assign

_BAD = "_bad"  # why a file of the batch could not be decoded ('' when all could)
_PROBE_THREADS = 16


@dataclasses.dataclass(frozen=True)
class Utterance:
    """One line of a manifest: the audio file (resolved), the normalised transcript, the
    length by the file's header, and the manifest line (1-based) it came from."""

    audio: str
    text: str
    info: AudioInfo
    line: int

    @property
    def duration(self) -> float:
        """Seconds, at the file's own rate."""
        return self.info.frames / self.info.sample_rate


def read_manifest(path: str) -> list[Utterance]:
    """The utterances of the manifest at ``path``, their headers read; ``UsageError`` naming
    the line for a line that is not an utterance and for an audio file that is absent or not
    readable audio (the first such line; how many more there are)."""
    entries = _parse(path)
    threads = _PROBE_THREADS if len(entries) > 64 else 1
    with ThreadPoolExecutor(threads) as pool:
        infos = list(pool.map(_probe, [audio for _, audio, _ in entries]))
    bad = [(line, info) for (line, _, _), info in zip(entries, infos, strict=True)
           if isinstance(info, BadAudio)]
    if bad:
        line, error = bad[0]
        if error.reason == "no such file":
            fix = (f"audio file {error.where} does not exist (a relative path is relative to "
                   f"the manifest's folder); correct the path or remove the line")
        else:
            fix = f"{error}; replace the file or remove the line"
        raise UsageError(f"{_where(path, line)}: {fix}{_more(len(bad) - 1)}")
    return [Utterance(audio, text, info, line)
            for (line, audio, text), info in zip(entries, infos, strict=True)]


def _parse(path: str) -> list[tuple[int, str, str]]:
    """(line, resolved audio path, normalised text) of each utterance line."""
    if not os.path.isfile(path):
        raise UsageError(f"no manifest file {path}; give the input's manifest as the path of a "
                         f"JSONL file of {{\"audio\": ..., \"text\": ...}} lines")
    folder, entries = os.path.dirname(os.path.abspath(path)), []
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            if raw.strip():
                audio, text = _entry(path, number, raw)
                entries.append((number, os.path.join(folder, audio), vocab.normalise(text)))
    if not entries:
        raise UsageError(f"manifest {path} holds no utterances; write one JSON line "
                         f"{{\"audio\": ..., \"text\": ...}} per utterance")
    return entries


def _entry(path: str, number: int, raw: str) -> tuple[str, str]:
    try:
        entry = json.loads(raw)
    except json.JSONDecodeError as e:
        raise UsageError(f"{_where(path, number)}: not JSON ({e.msg}); write one JSON object "
                         f"{{\"audio\": ..., \"text\": ...}} per line") from None
    if not isinstance(entry, dict):
        raise UsageError(f"{_where(path, number)}: not a JSON object; write "
                         f"{{\"audio\": ..., \"text\": ...}}")
    for key in ("audio", "text"):
        if not isinstance(entry.get(key), str):
            raise UsageError(f"{_where(path, number)}: no \"{key}\" string; every line needs "
                             f"\"audio\" (a file path) and \"text\" (its transcript)")
    return entry["audio"], entry["text"]


def _probe(audio: str) -> AudioInfo | BadAudio:
    try:
        return audio_info(audio)
    except BadAudio as bad:
        return bad


def _where(path: str, line: int) -> str:
    return f"manifest {path}, line {line}"


def _more(count: int) -> str:
    return f" ({count} more lines have problems)" if count else ""


@dataclasses.dataclass
class ManifestInput(IndexedInput):
    """Batches of the utterances of a JSONL ``manifest``, in length buckets.

    A batch holds this process's rows: ``audio`` (float32 ``[b, S]``, zero-padded),
    ``audio_length`` (int32 samples), ``text`` (int32 label ids ``[b, L]``, zero-padded),
    ``text_length`` (int32) and ``weight`` (float32, 0 on padding rows). ``S`` is the bound
    of the batch's bucket, ``round(bound * sample_rate)``: ``bucket_seconds`` are the buckets'
    upper bounds (``()``: one bucket, as long as the longest utterance); in training,
    utterances longer than the last are left out with a warning, and an eval set (not
    repeating) adds its longest utterance as a last bound, so every utterance counts. ``L``
    is ``max_text_length`` (0: the longest transcript rounded up to a multiple of 8).

    Files at another rate than ``sample_rate`` are resampled, or refused when
    ``on_other_rate="refuse"``. The batches (see ``buckets``) are the same for any process
    and worker count, and the position saved in checkpoints is the number of batches read
    (``IndexedInput``).
    """

    manifest: str = ""
    sample_rate: int = 16000
    on_other_rate: str = "resample"
    bucket_seconds: tuple[float, ...] = ()
    max_text_length: int = 0
    alphabet: str = vocab.ENGLISH

    def __post_init__(self):
        super().__post_init__()
        where = f"input '{self.name}'"
        self.bucket_seconds = tuple(float(b) for b in self.bucket_seconds)
        if self.on_other_rate not in ON_OTHER_RATE:
            raise UsageError(f"{where}: on_other_rate must be one of "
                             f"{', '.join(ON_OTHER_RATE)}, got {self.on_other_rate!r}")
        if self.sample_rate <= 0:
            raise UsageError(f"{where}: sample_rate must be > 0, got {self.sample_rate}")
        bounds = self.bucket_seconds
        if any(b <= 0 for b in bounds) or list(bounds) != sorted(set(bounds)):
            raise UsageError(f"{where}: bucket_seconds must be increasing positive seconds, "
                             f"got {bounds}")
        if self.max_text_length < 0:
            raise UsageError(f"{where}: max_text_length must be >= 0, got "
                             f"{self.max_text_length}")
        self._data: _Data | None = None

    def data(self) -> _Data:
        """The manifest, read and checked on first use (building a config reads nothing)."""
        if self._data is None:
            self._data = _Data(self)
        return self._data

    def check(self) -> None:
        self.data()
        self.peek()  # decodes this process's first batch: a damaged file fails here

    def abstract_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
        if self.bucket_seconds and self.max_text_length:  # planning: the data may be absent
            samples = _samples(self.bucket_seconds[-1], self.sample_rate)
            labels = self.max_text_length
        else:
            samples, labels = self.data().bounds[-1], self.data().text_length
        b = self.local_batch_size
        return {"audio": jax.ShapeDtypeStruct((b, samples), np.float32),
                "audio_length": jax.ShapeDtypeStruct((b,), np.int32),
                "text": jax.ShapeDtypeStruct((b, labels), np.int32),
                "text_length": jax.ShapeDtypeStruct((b,), np.int32),
                "weight": jax.ShapeDtypeStruct((b,), np.float32)}

    # The stream (IndexedInput).

    def data_key(self) -> str:
        return self.data().key

    def num_batches(self) -> int:
        return self.data().plan.num_batches

    def batch_reader(self) -> LoadBatch:
        return LoadBatch(self.data(), self)

    def received(self, batch: dict[str, Any], peeking: bool) -> dict[str, np.ndarray]:
        bad = str(batch.pop(_BAD))
        if bad:
            raise UsageError(f"input '{self.name}': cannot read {bad}; replace the file or "
                             f"remove its line from {self.manifest}")
        return batch

    def what_changed(self, saved_key: str) -> str:
        key = self.data().key
        if saved_key.partition("-")[0] != key.partition("-")[0]:
            return "the manifest's utterances (files, transcripts or lengths)"
        return "the settings (seed, batch_size, shuffle, repeat, sample_rate or bucket_seconds)"


class _Data:
    """A manifest input's utterances (those that fit the last bucket), label ids, bucket
    bounds in samples, batch plan and identity (``key``: utterances-settings)."""

    def __init__(self, spec: ManifestInput):
        where = f"input '{spec.name}'"
        if not spec.manifest:
            raise UsageError(f"{where}: no manifest; set the input's manifest to a JSONL file")
        utterances = read_manifest(spec.manifest)
        _check_utterances(spec, utterances)
        samples = np.asarray([u.info.samples_at(spec.sample_rate) for u in utterances])
        self.bounds = tuple(_samples(b, spec.sample_rate) for b in spec.bucket_seconds)
        if not self.bounds or (not spec.repeats and samples.max() > self.bounds[-1]):
            self.bounds = (*self.bounds, int(samples.max()))  # an eval set counts them all
        buckets = assign(samples, self.bounds)
        kept = np.flatnonzero(buckets < len(self.bounds))
        _warn_left_out(spec, utterances, samples, kept, self.bounds[-1])
        self.utterances = [utterances[i] for i in kept]
        self.samples, buckets = samples[kept], buckets[kept]
        chars = vocab.CharVocabulary(spec.alphabet)
        self.labels = [chars.encode(u.text) for u in self.utterances]
        longest = max(len(label) for label in self.labels)
        self.text_length = spec.max_text_length or max(8, -(-longest // 8) * 8)
        if spec.repeats:
            self.plan = TrainingPlan(buckets, len(self.bounds), spec.batch_size, spec.seed,
                                     spec.shuffles)
            if not self.plan.batches_per_epoch:
                counts = [len(m) for m in self.plan.members]
                raise UsageError(f"{where}: no bucket of {spec.manifest} holds a full batch of "
                                 f"{spec.batch_size} utterances (the buckets hold {counts}); "
                                 f"lower batch_size or use fewer, wider bucket_seconds")
        else:
            self.plan = EvalPlan(self.samples, buckets, spec.batch_size, spec.seed,
                                 spec.shuffles)
        folder = os.path.dirname(os.path.abspath(spec.manifest))  # the data may move whole
        self.key = "-".join((
            fingerprint([(os.path.relpath(u.audio, folder), u.text, u.info.frames,
                           u.info.sample_rate) for u in self.utterances]),
            fingerprint(spec.seed, spec.shuffles, spec.repeats, spec.batch_size,
                         spec.sample_rate, self.bounds)))


def _check_utterances(spec: ManifestInput, utterances: list[Utterance]) -> None:
    """``UsageError`` for the first utterance the settings cannot take: a refused rate,
    characters outside the alphabet, a transcript longer than ``max_text_length``."""
    chars, problems = vocab.CharVocabulary(spec.alphabet), []
    for u in utterances:
        if spec.on_other_rate == "refuse" and u.info.sample_rate != spec.sample_rate:
            problems.append((u, f"{u.audio} is sampled at {u.info.sample_rate} Hz, not "
                                f"{spec.sample_rate} Hz; set the input's "
                                f"on_other_rate='resample', or resample the file with sox "
                                f"(sox IN -r {spec.sample_rate} OUT)"))
        elif unknown := chars.unknown(u.text):
            problems.append((u, f"the transcript has characters outside the alphabet "
                                f"{spec.alphabet!r}: {unknown!r}; remove or spell them out, "
                                f"or set the input's alphabet"))
        elif spec.max_text_length and len(u.text) > spec.max_text_length:
            problems.append((u, f"the transcript is {len(u.text)} characters, longer than "
                                f"max_text_length {spec.max_text_length}; raise "
                                f"max_text_length or remove the line"))
    if problems:
        u, what = problems[0]
        raise UsageError(f"{_where(spec.manifest, u.line)}: {what}{_more(len(problems) - 1)}")


def _warn_left_out(spec: ManifestInput, utterances: list[Utterance], samples: np.ndarray,
                   kept: np.ndarray, bound: int) -> None:
    if not len(kept):
        raise UsageError(f"input '{spec.name}': every utterance of {spec.manifest} is longer "
                         f"than the last bucket ({bound / spec.sample_rate:g} s); raise "
                         f"bucket_seconds")
    left_out = len(utterances) - len(kept)
    if not left_out:
        return
    longest = int(np.argmax(samples))
    warn(f"input '{spec.name}': left out {left_out} utterances of {spec.manifest} longer than "
         f"the last bucket ({bound / spec.sample_rate:g} s), the longest "
         f"{samples[longest] / spec.sample_rate:.2f} s ({utterances[longest].audio}); add a "
         f"larger bound to bucket_seconds to train on them")


class LoadBatch:
    """Global batch ``k`` -> this process's rows of it, decoded and padded (a class, so that
    grain's worker processes unpickle it). A file that cannot be decoded is reported in the
    batch (``_BAD``), for the main process to stop with a line naming it."""

    def __init__(self, data: _Data, spec: ManifestInput):
        self.plan, self.bounds, self.labels = data.plan, data.bounds, data.labels
        self.paths = [u.audio for u in data.utterances]
        self.samples, self.text_length = data.samples, data.text_length
        self.rows = spec.process_rows()
        self.sample_rate, self.on_other_rate = spec.sample_rate, spec.on_other_rate

    def __call__(self, k: int) -> dict[str, Any]:
        bucket, rows = self.plan.batch(k)
        rows = rows[self.rows]
        n = len(rows)
        batch = {"audio": np.zeros((n, self.bounds[bucket]), np.float32),
                 "audio_length": np.zeros(n, np.int32),
                 "text": np.zeros((n, self.text_length), np.int32),
                 "text_length": np.zeros(n, np.int32), "weight": np.zeros(n, np.float32),
                 _BAD: ""}
        for i, u in enumerate(rows.tolist()):
            if u == PADDING:
                continue
            try:
                audio = self._read(u)
            except BadAudio as bad:
                batch[_BAD] = str(bad)
                return batch
            label = self.labels[u]
            batch["audio"][i, :len(audio)], batch["audio_length"][i] = audio, len(audio)
            batch["text"][i, :len(label)], batch["text_length"][i] = label, len(label)
            batch["weight"][i] = 1.0
        return batch

    def _read(self, u: int) -> np.ndarray:
        audio = read_audio(self.paths[u], self.sample_rate, self.on_other_rate)
        if len(audio) != self.samples[u]:
            raise BadAudio(self.paths[u], f"{len(audio)} samples, not the {self.samples[u]} "
                                          f"its header had when the manifest was checked: "
                                          f"the file changed")
        return audio


def _samples(seconds: float, sample_rate: int) -> int:
    return round(seconds * sample_rate)
