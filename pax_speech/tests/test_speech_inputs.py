"""pax-speech's audio inputs: files are read as mono float32 at the wanted rate, a bad manifest
is refused with a line naming what to fix, and the bucketed stream is seeded, shared out over
processes and workers, resumable and complete for evaluation."""

from __future__ import annotations

import json

import numpy as np
import pytest
import soundfile

from pax_core import UsageError
from pax_speech.inputs.audio import BadAudio, read_audio, resampled_length
from pax_speech.inputs.manifest import ManifestInput, read_manifest

RATE = 1000  # a low rate keeps the fixtures' arrays small
WORDS = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def _write_manifest(folder, lines, name="data.jsonl"):
    path = folder / name
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))
    return str(path)


@pytest.fixture
def manifest(tmp_path):
    """24 utterances of 0.1 to 2.4 s at RATE; every sample of file i is (i + 1) / 64, and its
    transcript is words for i."""
    (tmp_path / "audio").mkdir()
    lines = []
    for i in range(24):
        soundfile.write(tmp_path / "audio" / f"{i}.wav",
                        np.full(RATE * (i + 1) // 10, (i + 1) / 64, np.float32), RATE)
        lines.append({"audio": f"audio/{i}.wav", "text": f"{WORDS[i % 10]} {WORDS[i // 10]}",
                      "duration": 99.0})
    return _write_manifest(tmp_path, lines)


def _input(manifest, **settings):
    settings = {"batch_size": 4, "sample_rate": RATE, "bucket_seconds": (0.8, 1.6, 2.4),
                "seed": 3} | settings
    return ManifestInput(manifest=manifest, **settings)


def _ids(batch):
    """Which files a batch holds (their samples name them); -1 for padding rows."""
    return [round(float(a[0]) * 64) - 1 if w else -1
            for a, w in zip(batch["audio"], batch["weight"], strict=True)]


def _tone(frequency, rate, seconds=1.0, channels=1):
    t = np.arange(int(rate * seconds)) / rate
    tone = 0.5 * np.sin(2 * np.pi * frequency * t).astype(np.float32)
    return tone if channels == 1 else np.stack([tone, np.zeros_like(tone)], axis=1)


def _peak(audio, rate):
    spectrum = np.abs(np.fft.rfft(audio))
    return np.fft.rfftfreq(len(audio), 1 / rate)[np.argmax(spectrum)]


@pytest.mark.parametrize("rate", [8000, 22050, 16000])
def test_files_are_resampled_keeping_length_and_pitch(tmp_path, rate):
    path = tmp_path / "tone.flac"
    soundfile.write(path, _tone(440, rate, seconds=0.75), rate)
    audio = read_audio(str(path), 16000)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert len(audio) == resampled_length(int(rate * 0.75), rate, 16000) == 12000
    assert abs(_peak(audio, 16000) - 440) < 3
    assert np.abs(audio).max() <= 1.0


def test_stereo_becomes_the_mean_of_its_channels(tmp_path):
    path = tmp_path / "stereo.wav"
    soundfile.write(path, _tone(300, 16000, channels=2), 16000, subtype="FLOAT")
    np.testing.assert_allclose(read_audio(str(path), 16000), _tone(300, 16000) / 2, atol=1e-6)


def test_unreadable_audio_raises_bad_audio(tmp_path):
    (tmp_path / "text.wav").write_text("not audio")
    soundfile.write(tmp_path / "ok.wav", _tone(300, 8000), 8000)
    with pytest.raises(BadAudio, match=r"text\.wav"):
        read_audio(str(tmp_path / "text.wav"), 16000)
    with pytest.raises(BadAudio, match="sampled at 8000 Hz, not 16000 Hz"):
        read_audio(str(tmp_path / "ok.wav"), 16000, on_other_rate="refuse")
    with pytest.raises(BadAudio, match="no such file"):
        read_audio(str(tmp_path / "absent.wav"), 16000)


def _damage_flac(path):
    """A FLAC file whose header is intact and whose frames are garbage."""
    soundfile.write(path, _tone(300, RATE, seconds=2), RATE)
    data = bytearray(path.read_bytes())
    data[len(data) // 3:] = b"\x55" * (len(data) - len(data) // 3)
    path.write_bytes(bytes(data))


def test_read_manifest_resolves_paths_normalises_and_trusts_headers(manifest, tmp_path):
    utterances = read_manifest(manifest)
    assert len(utterances) == 24
    first = utterances[0]
    assert first.audio == str(tmp_path / "audio" / "0.wav") and first.line == 1
    assert first.duration == pytest.approx(0.1)  # the header's, not the manifest's 99 s
    path = _write_manifest(tmp_path, [{"audio": "audio/0.wav", "text": "  One   TWO "}],
                           "other.jsonl")
    assert read_manifest(path)[0].text == "one two"


def _bad_manifests(tmp_path):
    """(manifest lines, settings, the words the message must hold) of every refusal."""
    soundfile.write(tmp_path / "ok.wav", np.zeros(RATE, np.float32), RATE)
    soundfile.write(tmp_path / "slow.wav", np.zeros(800, np.float32), 800)
    (tmp_path / "text.wav").write_text("hello")
    ok = {"audio": "ok.wav", "text": "fine"}
    return {
        "not json": ([ok, "{oops"], {}, ["line 2", "not JSON"]),
        "no audio": ([ok, {"text": "x"}], {}, ["line 2", '"audio"']),
        "no text": ([{"audio": "ok.wav"}], {}, ["line 1", '"text"']),
        "absent file": ([ok, ok, {"audio": "gone.wav", "text": "x"}], {},
                        ["line 3", "gone.wav", "does not exist"]),
        "not audio": ([{"audio": "text.wav", "text": "x"}], {},
                      ["line 1", "text.wav", "not a readable audio file"]),
        "refused rate": ([ok, {"audio": "slow.wav", "text": "x"}], {"on_other_rate": "refuse"},
                         ["line 2", "800 Hz", "on_other_rate='resample'", "sox"]),
        "characters": ([{"audio": "ok.wav", "text": "naïve café!"}], {},
                       ["line 1", "outside the alphabet", "ïé!"]),
        "too long": ([ok, {"audio": "ok.wav", "text": "much too long"}],
                     {"max_text_length": 8}, ["line 2", "13 characters", "max_text_length"]),
        "empty": (["", "  "], {}, ["holds no utterances"]),
    }


@pytest.mark.parametrize("case", ["not json", "no audio", "no text", "absent file", "not audio",
                                  "refused rate", "characters", "too long", "empty"])
def test_bad_manifests_are_refused_naming_the_line(tmp_path, case):
    lines, settings, words = _bad_manifests(tmp_path)[case]
    path = _write_manifest(tmp_path, lines)
    with pytest.raises(UsageError) as error:
        _input(path, batch_size=1, bucket_seconds=(), **settings).check()
    message = str(error.value)
    assert "\n" not in message and path in message
    for word in words:
        assert word in message


def test_missing_manifest_and_bad_settings_are_refused(tmp_path):
    with pytest.raises(UsageError, match=r"no manifest file .*absent\.jsonl"):
        _input(str(tmp_path / "absent.jsonl")).check()
    with pytest.raises(UsageError, match="on_other_rate must be one of resample, refuse"):
        _input("x.jsonl", on_other_rate="drop")
    with pytest.raises(UsageError, match="bucket_seconds must be increasing"):
        _input("x.jsonl", bucket_seconds=(2.0, 1.0))


def test_buckets_that_cannot_be_filled_are_refused(manifest):
    with pytest.raises(UsageError, match=r"no bucket .* holds a full batch of 9 utterances"):
        _input(manifest, batch_size=9).check()
    with pytest.raises(UsageError, match=r"every utterance .* is longer than the last bucket"):
        _input(manifest, bucket_seconds=(0.05,)).check()


def test_files_of_other_rates_are_resampled_in_batches(tmp_path):
    for rate in (800, 2205):
        soundfile.write(tmp_path / f"{rate}.wav", _tone(100, rate), rate)
    lines = [{"audio": f"{rate}.wav", "text": "tone"} for rate in (800, 2205)]
    data = _input(_write_manifest(tmp_path, lines), batch_size=2, bucket_seconds=(1.0,))
    data.check()
    batch = data.get_next()
    assert batch["audio"].shape == (2, RATE) and batch["audio_length"].tolist() == [RATE] * 2
    assert all(abs(_peak(row, RATE) - 100) < 2 for row in batch["audio"])


def test_damaged_audio_fails_the_check_or_the_batch_that_reads_it(tmp_path):
    soundfile.write(tmp_path / "ok.wav", np.zeros(RATE, np.float32), RATE)
    _damage_flac(tmp_path / "bad.flac")
    lines = [{"audio": "bad.flac", "text": "x"}, {"audio": "ok.wav", "text": "y"}]
    with pytest.raises(UsageError, match=r"cannot read .*bad\.flac"):
        _input(_write_manifest(tmp_path, lines), batch_size=2, bucket_seconds=(),
               is_training=False).check()
    later = _input(_write_manifest(tmp_path, lines[::-1]), batch_size=1, bucket_seconds=(),
                   is_training=False)
    later.check()
    later.get_next()
    with pytest.raises(UsageError, match=r"cannot read .*bad\.flac"):
        later.get_next()


def test_each_batch_is_padded_to_its_bucket(manifest):
    data = _input(manifest)
    data.check()
    bounds = [0, 800, 1600, 2400]
    for _ in range(12):
        batch = data.get_next()
        size = batch["audio"].shape[1]
        assert size in bounds[1:]
        lengths = batch["audio_length"]
        assert (lengths <= size).all() and (lengths > bounds[bounds.index(size) - 1]).all()
        assert batch["text"].shape == (4, 16) and batch["text"].dtype == np.int32
        assert batch["weight"].tolist() == [1, 1, 1, 1]
        for row, length in zip(batch["audio"], lengths, strict=True):
            assert (row[length:] == 0).all() and (row[:length] != 0).all()


def _stream(manifest, n, **settings):
    data = _input(manifest, **settings)
    return [_ids(data.get_next()) for _ in range(n)]


def test_training_epochs_cover_full_batches_and_reshuffle(manifest):
    stream = _stream(manifest, 12)  # buckets of 8 utterances: 2 batches each, no remainder
    epochs = [stream[:6], stream[6:]]
    for epoch in epochs:
        assert sorted(i for batch in epoch for i in batch) == list(range(24))
    assert epochs[0] != epochs[1]
    assert stream == _stream(manifest, 12) and stream != _stream(manifest, 12, seed=4)


def test_a_bucket_remainder_differs_between_epochs(manifest):
    stream = _stream(manifest, 12, batch_size=5, bucket_seconds=(2.4,))  # 4 batches, 4 left
    epochs = [{i for batch in stream[e:e + 4] for i in batch} for e in (0, 4, 8)]
    assert all(len(e) == 20 for e in epochs) and len({frozenset(e) for e in epochs}) > 1


def test_processes_and_workers_read_the_same_global_batches(manifest):
    whole = _input(manifest)
    halves = [_input(manifest) for _ in range(2)]
    for p, half in enumerate(halves):
        half.shard(p, 2)
    workers = _input(manifest, num_workers=2)
    try:
        for _ in range(8):
            batch, other = whole.get_next(), workers.get_next()
            parts = [h.get_next() for h in halves]
            for key in batch:
                np.testing.assert_array_equal(batch[key],
                                              np.concatenate([p[key] for p in parts]))
                np.testing.assert_array_equal(batch[key], other[key])
        assert workers.get_state() == whole.get_state() == halves[1].get_state()
    finally:
        workers.close()


def test_eval_reads_every_utterance_once_then_stops(manifest):
    data = _input(manifest, batch_size=5, is_training=False, bucket_seconds=(0.8, 1.6, 2.0))
    batches = []
    with pytest.raises(StopIteration):
        while True:
            batches.append(data.get_next())
    ids = [i for b in batches for i in _ids(b)]
    assert [i for i in ids if i >= 0] == list(range(24))  # in order of length, all of them
    assert ids[-1] == -1  # padding
    # Past the last bound (2 s), the eval set's longest utterance (2.4 s) is a bound too.
    assert [b["audio"].shape[1] for b in batches] == [800, 1600, 1600, 2000, 2400]
    data = _input(manifest, batch_size=6, is_training=False, bucket_seconds=(2.4,))
    last = [data.get_next() for _ in range(4)][-1]
    assert _ids(last) == [18, 19, 20, 21, 22, 23]
    data = _input(manifest, batch_size=7, is_training=False, bucket_seconds=(2.4,))
    last = [data.get_next() for _ in range(4)][-1]
    assert last["weight"].tolist() == [1, 1, 1, 0, 0, 0, 0]
    assert (last["audio_length"][3:] == 0).all() and (last["text_length"][3:] == 0).all()


def test_training_leaves_out_utterances_past_the_last_bucket_with_one_warning(manifest,
                                                                            capsys):
    data = _input(manifest, batch_size=8, bucket_seconds=(1.0,))
    data.check()
    data.get_next()
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 1
    assert "left out 14 utterances" in warnings[0] and "2.40 s" in warnings[0]
    evaluation = _input(manifest, is_training=False, batch_size=8, bucket_seconds=(1.0,))
    evaluation.check()
    assert not capsys.readouterr().err


def test_the_position_resumes_on_the_next_batch(manifest):
    data = _input(manifest)
    for _ in range(7):
        data.get_next()
    saved = json.loads(json.dumps(data.get_state()))
    expected = [_ids(data.get_next()) for _ in range(3)]
    resumed = _input(manifest)
    resumed.set_state(saved)
    assert [_ids(resumed.get_next()) for _ in range(3)] == expected
    with pytest.raises(UsageError, match=r"settings \(seed"):
        _input(manifest, seed=5).set_state(saved)


def test_a_position_of_other_utterances_is_refused(manifest, tmp_path):
    saved = _input(manifest).get_state()
    lines = (tmp_path / "data.jsonl").read_text().splitlines()
    changed = _write_manifest(tmp_path, [*lines[:-1], lines[-1].replace("four", "five")])
    with pytest.raises(UsageError, match="the manifest's utterances"):
        _input(changed).set_state(saved)


def test_abstract_batch_is_the_longest_bucket_and_may_read_nothing(manifest, tmp_path):
    planned = _input(str(tmp_path / "absent.jsonl"), bucket_seconds=(1.0, 15.5),
                     max_text_length=200, sample_rate=16000, batch_size=8)
    planned.shard(1, 2)
    shapes = {k: (v.shape, v.dtype) for k, v in planned.abstract_batch().items()}
    assert shapes == {"audio": ((4, 248000), np.float32), "audio_length": ((4,), np.int32),
                      "text": ((4, 200), np.int32), "text_length": ((4,), np.int32),
                      "weight": ((4,), np.float32)}
    derived = _input(manifest, bucket_seconds=()).abstract_batch()
    assert derived["audio"].shape == (4, 2400) and derived["text"].shape == (4, 16)
