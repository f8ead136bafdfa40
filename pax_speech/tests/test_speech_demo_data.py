"""``pax speech make-demo-data``: it writes manifests the input reads, 16 kHz audio, held-out
sentences the training set lacks, the real recordings when their package is installed, the
same sentences for a seed, and refuses what it cannot do with one line, the output's faults
before the tools'.

The data set checked is the one the conftest's ``demo_data`` speaks once per test run (64
training and 8 held-out utterances, seed 7), which skips where the voices are absent."""

from __future__ import annotations

import os

import pytest
import soundfile
from typer.testing import CliRunner

from pax_core import UsageError
from pax_speech.commands.demo_data import TESTDATA, app, make_demo_data, sentences
from pax_speech.inputs.manifest import read_manifest


def _texts(path):
    return [u.text for u in read_manifest(str(path))]


def test_demo_data_is_16_khz_with_unseen_held_out_sentences(demo_data):
    folder, output = demo_data
    assert "wrote 64 training, 8 held-out" in output and "hours of audio" in output
    train = read_manifest(str(folder / "train.jsonl"))
    heldout = read_manifest(str(folder / "heldout.jsonl"))
    assert (len(train), len(heldout)) == (64, 8)
    for u in train + heldout:
        assert (u.info.sample_rate, u.info.channels) == (16000, 1) and u.duration > 0.3
        assert u.audio.startswith(str(folder / "audio"))
        assert soundfile.info(u.audio).subtype == "PCM_16"
    train_texts = {u.text for u in train}
    assert not train_texts & {u.text for u in heldout}
    words = {w for t in train_texts for w in t.split()}
    assert all(words.issuperset(u.text.split()) for u in heldout)
    assert '"audio": "audio/' in (folder / "train.jsonl").read_text()  # relative paths


@pytest.mark.skipif(not TESTDATA.is_dir(), reason=f"no {TESTDATA}: needs apt install "
                                                   f"pocketsphinx-testdata")
def test_real_recordings_are_copied_in(demo_data):
    folder, output = demo_data
    real = read_manifest(str(folder / "real.jsonl"))
    assert len(real) == 10 and "10 real" in output
    assert all(u.audio.startswith(str(folder / "real")) for u in real)
    assert "ten of clubs" in {u.text for u in real}


def test_the_same_seed_gives_the_same_sentences(demo_data, tmp_path):
    folder, _ = demo_data
    summary = make_demo_data(tmp_path / "again", utterances=64, heldout=8, seed=7, jobs=2,
                             testdata=tmp_path / "no-testdata")
    assert (tmp_path / "again" / "train.jsonl").read_text() == \
        (folder / "train.jsonl").read_text()
    assert _texts(tmp_path / "again" / "heldout.jsonl") == _texts(folder / "heldout.jsonl")
    assert "real.jsonl skipped" in summary and "pocketsphinx-testdata" in summary
    assert not (tmp_path / "again" / "real.jsonl").exists()
    assert sentences(24, 4, 8) != sentences(24, 4, 7)


@pytest.fixture
def without_tools(tmp_path, monkeypatch):
    """A PATH without the synthesisers (an empty folder), as on a machine without them."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))


def test_a_folder_with_files_is_refused_untouched(tmp_path, without_tools):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    result = CliRunner().invoke(app, ["make-demo-data", str(tmp_path / "out"),
                                      "--utterances", "2"])
    assert isinstance(result.exception, UsageError) and result.exception.exit_code == 2
    assert "not an empty folder" in str(result.exception)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]


@pytest.mark.parametrize(("output", "expected"), [
    ("a-file", "exists and is not an empty folder"),
    ("a-file/data", "which is a file, not a folder"),
    ("a-file/deeper/data", "which is a file, not a folder"),
])
def test_an_output_that_cannot_be_a_folder_is_refused_first(tmp_path, without_tools, output,
                                                             expected):
    (tmp_path / "a-file").write_text("mine")
    with pytest.raises(UsageError, match=expected):
        make_demo_data(tmp_path / output, utterances=0)  # its counts and tools are bad too
    assert (tmp_path / "a-file").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "bin"]


def test_a_folder_without_write_permission_is_refused(tmp_path, without_tools):
    (tmp_path / "locked").mkdir(mode=0o555)
    if os.access(tmp_path / "locked", os.W_OK):
        pytest.skip("this user may write in read-only folders (root)")
    with pytest.raises(UsageError, match=f"cannot write in {tmp_path / 'locked'}"):
        make_demo_data(tmp_path / "locked" / "new" / "data")


def test_bad_counts_are_refused_before_the_tools(tmp_path, without_tools):
    with pytest.raises(UsageError, match="--utterances and --jobs must be >= 1"):
        make_demo_data(tmp_path / "out", utterances=0)
    assert not (tmp_path / "out").exists()


def test_missing_tools_are_named_with_their_packages(tmp_path, without_tools):
    with pytest.raises(UsageError, match="apt install flite espeak-ng sox pocketsphinx-testdata"):
        make_demo_data(tmp_path / "out", utterances=2, heldout=1)
    assert not (tmp_path / "out").exists()
