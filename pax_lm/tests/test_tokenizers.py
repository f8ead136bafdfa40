"""Tokenizers round-trip text exactly, load lazily, and name the file in every error; the
``pax tokenizer`` app trains a model from a folder."""

import json

import fiddle as fdl
import numpy as np
import pytest
from typer.testing import CliRunner

from pax_core import UsageError
from pax_lm.commands.tokenizer import app
from pax_lm.tokenizers import (
    ByteTokenizer,
    HfTokenizer,
    SentencePieceTokenizer,
    tokenizer_from_path,
    train_sentencepiece,
)

WORDS = ["the", "and", "of", "to", "in", "that", "he", "shall", "unto", "for", "his", "lord",
         "they", "be", "is", "him", "not", "them", "it", "with", "all", "thou", "thy", "was",
         "god", "which", "my", "me", "said", "but", "ye", "their", "have", "will", "thee", "from",
         "as", "are", "when", "this", "out", "were", "upon", "man", "by", "you", "israel", "king",
         "son"]

# Text the tiny models never saw: other scripts, emoji, runs of spaces, tabs, CRLF, edges.
UNSEEN = [
    "Grüße aus Köln — naïve café, ¿qué tal?",
    "日本語のテキスト、中文文本, 한국어 텍스트",
    "Emoji: 😀👍🏽🇫🇷 👨‍👩‍👧 and math ∑∫√∞",
    "  leading spaces, trailing spaces   ",
    "tabs\tand\ttabs\r\nwindows lines\n\n\nblank lines",
    "\x00control\x07chars\x7f",
    "",
]


def documents(count: int, seed: int = 0) -> list[str]:
    """Deterministic English-like documents: lines of 5-15 words."""
    rng = np.random.default_rng(seed)
    return ["\n".join(" ".join(rng.choice(WORDS, rng.integers(5, 16))).capitalize() + "."
                      for _ in range(rng.integers(2, 8)))
            for _ in range(count)]


@pytest.fixture(scope="module")
def sample() -> list[str]:
    return documents(60)  # about 15 KB


def test_byte_tokenizer_round_trips_any_text(sample):
    tok = ByteTokenizer()
    for text in [*UNSEEN, *sample[:5]]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text
        assert all(3 <= i < tok.vocab_size for i in ids)
        assert len(ids) == len(text.encode("utf-8"))
    assert (tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id) == (259, 0, 1, 2)
    assert tok.encode("A") == [ord("A") + 3]


def test_byte_tokenizer_decode_skips_special_and_unknown_ids():
    tok = ByteTokenizer()
    ids = [tok.bos_id, *tok.encode("hi"), 300, tok.eos_id, tok.pad_id, tok.pad_id]
    assert tok.decode(ids) == "hi"
    assert tok.decode(tok.encode("é")[:1]) == "\ufffd"  # half a character


def test_byte_encode_batch_matches_encode(sample):
    tok = ByteTokenizer()
    batch = tok.encode_batch(sample[:4])
    assert [b.tolist() for b in batch] == [tok.encode(t) for t in sample[:4]]
    assert all(b.dtype == np.int32 for b in batch)


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_round_trips_exactly(tmp_path, sample, model_type):
    path = train_sentencepiece(sample, tmp_path / "spm", vocab_size=350, model_type=model_type)
    assert path == str(tmp_path / "spm.model")
    assert (tmp_path / "spm.vocab").is_file()
    tok = SentencePieceTokenizer(path)
    assert (tok.vocab_size, tok.pad_id, tok.bos_id, tok.eos_id) == (350, 0, 1, 2)
    for text in [*sample[:10], *UNSEEN, "\n".join(sample[:3])]:
        assert tok.decode(tok.encode(text)) == text
    text = sample[0]
    assert len(tok.encode(text)) < len(text.encode()) / 2  # it learned pieces, not bytes
    assert [b.tolist() for b in tok.encode_batch(sample[:3])] == [tok.encode(t)
                                                                  for t in sample[:3]]
    assert tok.decode([tok.bos_id, *tok.encode("the lord"), tok.eos_id, 0, 0]) == "the lord"


def test_sentencepiece_trains_on_a_sample_of_lines(tmp_path, sample):
    path = train_sentencepiece(sample, tmp_path / "small", vocab_size=300, max_sentences=50)
    assert SentencePieceTokenizer(path).decode(SentencePieceTokenizer(path).encode(sample[-1])) \
        == sample[-1]


def test_sentencepiece_training_errors(tmp_path, sample):
    with pytest.raises(UsageError, match=r"Vocabulary size too high \(50000\)"):
        train_sentencepiece(sample, tmp_path / "m", vocab_size=50000)
    with pytest.raises(UsageError, match="model type 'word'"):
        train_sentencepiece(sample, tmp_path / "m", vocab_size=300, model_type="word")
    with pytest.raises(UsageError, match="no text"):
        train_sentencepiece(["", "  \n "], tmp_path / "m", vocab_size=300)
    with pytest.raises(UsageError, match=r"no such file or folder: .*missing"):
        train_sentencepiece(str(tmp_path / "missing"), tmp_path / "m", vocab_size=300)


def train_hf(path, texts):
    """A tiny byte-level BPE in a tokenizer.json, as a user would bring one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(str(path))
    return str(path)


def test_hf_tokenizer_round_trips_exactly(tmp_path, sample):
    tok = HfTokenizer(train_hf(tmp_path / "tokenizer.json", sample))
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
    assert tok.vocab_size == 400
    for text in [*sample[:10], *UNSEEN]:
        assert tok.decode(tok.encode(text)) == text
    assert [b.tolist() for b in tok.encode_batch(sample[:3])] == [tok.encode(t)
                                                                  for t in sample[:3]]
    assert tok.decode([tok.bos_id, *tok.encode("the lord"), tok.eos_id, 0]) == "the lord"


def test_hf_special_tokens_by_name(tmp_path, sample):
    path = train_hf(tmp_path / "tokenizer.json", sample)
    tok = HfTokenizer(path, eos_token="<s>", pad_token="</s>")
    assert (tok.pad_id, tok.bos_id, tok.eos_id) == (2, 1, 1)
    with pytest.raises(UsageError, match=r"tokenizer .*tokenizer.json has no token '<eot>'"):
        _ = HfTokenizer(path, eos_token="<eot>").eos_id


def test_tokenizers_load_lazily_and_name_missing_files(tmp_path):
    missing = str(tmp_path / "nowhere" / "tok.model")
    config = fdl.Config(SentencePieceTokenizer, model_path=missing)
    tok = fdl.build(config)  # builds: nothing is read until first use
    with pytest.raises(UsageError, match=f"SentencePiece model not found: {missing}"):
        tok.encode("x")
    with pytest.raises(UsageError, match=r"tokenizer JSON not found: .*nowhere\.json"):
        HfTokenizer(str(tmp_path / "nowhere.json")).encode("x")


def test_tokenizers_refuse_files_of_another_kind(tmp_path):
    bad = tmp_path / "bad.model"
    bad.write_text("not a model")
    with pytest.raises(UsageError, match=f"not a SentencePiece model: {bad}"):
        _ = SentencePieceTokenizer(str(bad)).vocab_size
    bad_json = tmp_path / "bad.json"
    bad_json.write_text(json.dumps({"hello": 1}))
    with pytest.raises(UsageError, match=f"not a Hugging Face tokenizer JSON: {bad_json}"):
        _ = HfTokenizer(str(bad_json)).vocab_size


def test_tokenizer_from_path():
    assert tokenizer_from_path("bytes") == ByteTokenizer()
    assert tokenizer_from_path("a/b.model") == SentencePieceTokenizer("a/b.model")
    assert tokenizer_from_path("a/tokenizer.json") == HfTokenizer("a/tokenizer.json")
    with pytest.raises(UsageError, match="unknown tokenizer 'gpt2'"):
        tokenizer_from_path("gpt2")


@pytest.fixture
def corpus_folder(tmp_path, sample):
    folder = tmp_path / "corpus"
    (folder / "nested").mkdir(parents=True)
    for i, text in enumerate(sample[:30]):
        (folder / f"doc{i:02d}.txt").write_text(text)
    with open(folder / "nested" / "more.jsonl", "w") as f:
        for text in sample[30:]:
            f.write(json.dumps({"body": text}) + "\n")
    return folder


def test_cli_trains_a_model_from_a_folder(tmp_path, corpus_folder, sample):
    output = tmp_path / "out" / "kjv"
    result = CliRunner().invoke(app, ["train", "--input", str(corpus_folder), "--text-key",
                                      "body", "--vocab-size", "300", "--output", str(output),
                                      "--model-type", "bpe"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == f"{output}.model"
    assert (tmp_path / "out" / "kjv.vocab").is_file()
    tok = SentencePieceTokenizer(f"{output}.model")
    assert tok.vocab_size == 300
    assert tok.decode(tok.encode(sample[40])) == sample[40]

    result = CliRunner().invoke(app, ["encode", "--tokenizer", f"{output}.model", "the lord"])
    assert result.exit_code == 0, result.output
    ids, decoded = result.output.splitlines()
    assert [int(i) for i in ids.split()] == tok.encode("the lord")
    assert decoded.endswith("decoded: 'the lord'")


def test_cli_errors_are_usage_errors(tmp_path):
    missing = tmp_path / "missing"
    result = CliRunner().invoke(app, ["train", "--input", str(missing), "--output",
                                      str(tmp_path / "m")])
    assert isinstance(result.exception, UsageError)
    assert str(result.exception) == f"no such file or folder: {missing}"
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "blank.txt").write_text("\n \n")
    result = CliRunner().invoke(app, ["train", "--input", str(empty), "--output",
                                      str(tmp_path / "m")])
    assert isinstance(result.exception, UsageError)
    assert str(result.exception) == f"no text in {empty}"
