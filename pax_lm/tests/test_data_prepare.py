"""pax data prepare: every source kind into shards whose records are the documents' ids, the
same shards with worker processes, resumed after an interruption, and each mistake refused with
nothing written."""

import gzip
import json
import os

import numpy as np
import pytest

from pax_core import UsageError, make_tf_example
from pax_core.testing import run_pax
from pax_lm.data.shards import PreparedDataset
from pax_lm.preparation import PROGRESS, prepare
from pax_lm.tokenizers import ByteTokenizer

BYTES = ByteTokenizer()


def documents(count: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghij klmnopqrstuvwxyz\n"))
    return [f"doc {seed}.{i}: " + "".join(rng.choice(letters, rng.integers(5, 300)))
            for i in range(count)]


def write_sources(folder, docs: list[str]) -> list[str]:
    """docs spread over one file of each kind; returns them in the order prepare reads them
    (sorted by path)."""
    from array_record.python.array_record_module import ArrayRecordWriter

    folder.mkdir(parents=True, exist_ok=True)
    a, b, c, d = np.array_split(np.arange(len(docs)), 4)
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": docs[i], "n": 1}) + "\n"
                                            for i in a))
    with gzip.open(folder / "b.json.gz", "wt") as f:
        f.writelines(json.dumps({"text": docs[i]}) + "\n" for i in b)
    writer = ArrayRecordWriter(str(folder / "c-train.array_record-00000-of-00001"), "group_size:1")
    for i in c:
        writer.write(make_tf_example(text=docs[i], url="http://x"))
    writer.close()
    (folder / "d.txt").write_text(docs[d[0]])
    return [docs[i] for i in [*a, *b, *c, d[0]]]


def decoded(path) -> list[str]:
    data = PreparedDataset.open(path)
    return [BYTES.decode(ids) for ids in data.tokens(list(range(data.num_documents)))]


def test_every_kind_of_source_becomes_its_documents_in_order(tmp_path):
    expected = write_sources(tmp_path / "src", documents(60))
    metadata = prepare(tmp_path / "src", tmp_path / "out", shard_mb=0.002, workers=0)
    assert decoded(tmp_path / "out") == expected
    data = PreparedDataset.open(tmp_path / "out")
    assert len(data.shards) > 2 and metadata["documents"] == len(expected)
    assert np.asarray(data.index).tolist() == [len(d.encode()) for d in expected]
    assert data.num_tokens == sum(len(d.encode()) for d in expected)
    assert [s["path"].rsplit("/", 1)[1] for s in metadata["sources"]] == [
        "a.jsonl", "b.json.gz", "c-train.array_record-00000-of-00001", "d.txt"]
    assert not (tmp_path / "out" / PROGRESS).exists()


def test_parquet_column(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    docs = documents(20, seed=3)
    pq.write_table(pa.table({"body": docs, "n": list(range(20))}), tmp_path / "x.parquet")
    prepare(tmp_path / "x.parquet", tmp_path / "out", field="body", workers=0)
    assert decoded(tmp_path / "out") == docs
    with pytest.raises(UsageError, match="no column 'text'"):
        prepare(tmp_path / "x.parquet", tmp_path / "out2", workers=0)
    assert not (tmp_path / "out2").exists()


def test_worker_processes_write_the_same_shards(tmp_path):
    write_sources(tmp_path / "src", documents(80))
    prepare(tmp_path / "src", tmp_path / "one", shard_mb=0.003, workers=0)
    prepare(tmp_path / "src", tmp_path / "two", shard_mb=0.003, workers=2)
    one, two = (PreparedDataset.open(tmp_path / d) for d in ("one", "two"))
    assert len(one.shards) >= 3 and one.shards == two.shards
    for shard in one.shards:
        assert (tmp_path / "one" / shard.name).read_bytes() == (
            tmp_path / "two" / shard.name).read_bytes()


def interrupt(record, seconds):
    """An on_shard callback: Ctrl-C as the first shard completes."""
    raise KeyboardInterrupt


def test_an_interrupted_preparation_resumes_keeping_finished_shards(tmp_path):
    write_sources(tmp_path / "src", documents(80))

    with pytest.raises(KeyboardInterrupt):
        prepare(tmp_path / "src", tmp_path / "out", shard_mb=0.003, workers=0, on_shard=interrupt)
    first = tmp_path / "out" / "shards" / "tokens-00000.array_record"
    made = first.stat().st_mtime_ns
    assert not (tmp_path / "out" / "metadata.json").exists()
    with pytest.raises(UsageError, match="preparation did not finish"):
        PreparedDataset.open(tmp_path / "out")
    seen = []
    prepare(tmp_path / "src", tmp_path / "out", shard_mb=0.003, workers=0,
            on_shard=lambda record, seconds: seen.append(record["name"]))
    assert first.stat().st_mtime_ns == made  # kept, not written again
    prepare(tmp_path / "src", tmp_path / "whole", shard_mb=0.003, workers=0)
    assert decoded(tmp_path / "out") == decoded(tmp_path / "whole")
    assert len(seen) == len(PreparedDataset.open(tmp_path / "whole").shards)


def test_mistakes_are_refused_and_nothing_is_changed(tmp_path):
    write_sources(tmp_path / "src", documents(10))
    with pytest.raises(UsageError, match="no such file or folder"):
        prepare(tmp_path / "missing", tmp_path / "out")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        prepare(tmp_path / "src", tmp_path / "busy", workers=0)
    assert os.listdir(tmp_path / "busy") == ["notes.txt"]
    prepare(tmp_path / "src", tmp_path / "out", workers=0)
    before = sorted(p.name for p in (tmp_path / "out").iterdir())
    with pytest.raises(UsageError, match="already holds a prepared dataset"):
        prepare(tmp_path / "src", tmp_path / "out", workers=0)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == before
    (tmp_path / "blank").mkdir()
    (tmp_path / "blank" / "a.jsonl").write_text(json.dumps({"text": "  "}) + "\n")
    with pytest.raises(UsageError, match="every document is empty"):
        prepare(tmp_path / "blank", tmp_path / "none", workers=0)
    assert not (tmp_path / "none").exists()
    with pytest.raises(UsageError, match="no field 'body'"):
        prepare(tmp_path / "src", tmp_path / "other", field="body", workers=0)
    assert not (tmp_path / "other").exists()  # so the corrected command runs


def test_an_unfinished_preparation_of_other_sources_is_refused(tmp_path):
    write_sources(tmp_path / "src", documents(40))

    with pytest.raises(KeyboardInterrupt):
        prepare(tmp_path / "src", tmp_path / "out", shard_mb=0.003, workers=0, on_shard=interrupt)
    with pytest.raises(UsageError, match="unfinished preparation of other settings: --shard-mb"):
        prepare(tmp_path / "src", tmp_path / "out", shard_mb=0.004, workers=0)
    (tmp_path / "src" / "e.txt").write_text("one more document")
    with pytest.raises(UsageError, match="unfinished preparation of other sources"):
        prepare(tmp_path / "src", tmp_path / "out", shard_mb=0.003, workers=0)


def test_workers_interrupted_resume_and_an_output_inside_the_source(tmp_path):
    expected = write_sources(tmp_path / "src", documents(80))
    out = tmp_path / "src" / "prepared"  # inside the source: its shards are not sources
    with pytest.raises(KeyboardInterrupt):
        prepare(tmp_path / "src", out, shard_mb=0.003, workers=2, on_shard=interrupt)
    assert not (out / "metadata.json").exists()
    prepare(tmp_path / "src", out, shard_mb=0.003, workers=2)
    assert decoded(out) == expected


@pytest.mark.slow
def test_command_line_prepares_and_inspects(tmp_path):
    expected = write_sources(tmp_path / "src", documents(30))
    out = tmp_path / "out"
    result = run_pax("data", "prepare", str(tmp_path / "src"), "--output", str(out),
                     "--workers", "1")
    assert result.returncode == 0, result.stderr
    assert f"prepared {len(expected)} documents" in result.stdout
    result = run_pax("data", "inspect", str(out), "--records", "2", "--verify")
    assert result.returncode == 0, result.stderr
    assert f"{len(expected)} documents" in result.stdout
    assert "verified: every record of the 1 shards reads" in result.stdout
    assert repr(expected[0][:200]) in result.stdout
    result = run_pax("data", "prepare", str(tmp_path / "src"), "--output", str(out))
    assert result.returncode == 2 and "already holds a prepared dataset" in result.stderr
    result = run_pax("data", "inspect", str(tmp_path / "nothing"))
    assert result.returncode == 2 and "no such data directory" in result.stderr
