"""``pax speech make-demo-data``: it writes manifests the input reads, 16 kHz audio, held-out
sentences the training set lacks, the real recordings when their package is installed, the
same sentences for a seed, and refuses what it cannot do with one line."""

from __future__ import annotations

import shutil

import pytest
import soundfile
from typer.testing import CliRunner

from pax_core import UsageError
from pax_speech.commands.demo_data import TESTDATA, TOOLS, app, make_demo_data, sentences
from pax_speech.inputs.manifest import read_manifest

needs_tools = pytest.mark.skipif(
    any(shutil.which(tool) is None for tool in TOOLS),
    reason="needs flite, espeak-ng and sox (apt install flite espeak-ng sox)")


def _texts(path):
    return [u.text for u in read_manifest(str(path))]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo") / "data"
    result = CliRunner().invoke(app, ["make-demo-data", str(folder), "--utterances", "24",
                                      "--heldout", "4", "--seed", "7", "--jobs", "2"])
    assert result.exit_code == 0, result.output
    return folder, result.output


@needs_tools
def test_demo_data_is_16_khz_with_unseen_held_out_sentences(demo):
    folder, output = demo
    assert "wrote 24 training, 4 held-out" in output and "hours of audio" in output
    train = read_manifest(str(folder / "train.jsonl"))
    heldout = read_manifest(str(folder / "heldout.jsonl"))
    assert (len(train), len(heldout)) == (24, 4)
    for u in train + heldout:
        assert (u.info.sample_rate, u.info.channels) == (16000, 1) and u.duration > 0.3
        assert u.audio.startswith(str(folder / "audio"))
        assert soundfile.info(u.audio).subtype == "PCM_16"
    train_texts = {u.text for u in train}
    assert not train_texts & {u.text for u in heldout}
    words = {w for t in train_texts for w in t.split()}
    assert all(words.issuperset(u.text.split()) for u in heldout)
    assert '"audio": "audio/' in (folder / "train.jsonl").read_text()  # relative paths


@needs_tools
@pytest.mark.skipif(not TESTDATA.is_dir(), reason="needs apt install pocketsphinx-testdata")
def test_real_recordings_are_copied_in(demo):
    folder, output = demo
    real = read_manifest(str(folder / "real.jsonl"))
    assert len(real) == 10 and "10 real" in output
    assert all(u.audio.startswith(str(folder / "real")) for u in real)
    assert "ten of clubs" in {u.text for u in real}


@needs_tools
def test_the_same_seed_gives_the_same_sentences(demo, tmp_path):
    folder, _ = demo
    summary = make_demo_data(tmp_path / "again", utterances=24, heldout=4, seed=7, jobs=1,
                             testdata=tmp_path / "no-testdata")
    assert (tmp_path / "again" / "train.jsonl").read_text() == \
        (folder / "train.jsonl").read_text()
    assert _texts(tmp_path / "again" / "heldout.jsonl") == _texts(folder / "heldout.jsonl")
    assert "real.jsonl skipped" in summary and "pocketsphinx-testdata" in summary
    assert not (tmp_path / "again" / "real.jsonl").exists()
    assert sentences(24, 4, 8) != sentences(24, 4, 7)


def test_a_folder_with_files_is_refused_untouched(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    result = CliRunner().invoke(app, ["make-demo-data", str(tmp_path), "--utterances", "2"])
    assert isinstance(result.exception, UsageError) and result.exception.exit_code == 2
    assert "not an empty folder" in str(result.exception)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_missing_tools_are_named_with_their_packages(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without the synthesisers
    with pytest.raises(UsageError, match="apt install flite espeak-ng sox pocketsphinx-testdata"):
        make_demo_data(tmp_path / "out", utterances=2, heldout=1)
    assert not (tmp_path / "out").exists()
