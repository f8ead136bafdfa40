"""TokensInput streams prepared datasets: every token once per epoch (packed or concatenated),
the same rows on any number of processes and workers, exact resume (also onto another process
count), weighted mixtures, padded evaluation, and one clear line for each mistake."""

import collections
import json

import numpy as np
import pytest
from test_data_prepare import documents
from test_text_input import all_rows

from pax_core import UsageError
from pax_lm.data.shards import PreparedDataset
from pax_lm.inputs.tokens import TokensInput
from pax_lm.preparation import prepare
from pax_lm.tokenizers import ByteTokenizer

BYTES = ByteTokenizer()


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict[str, str]:
    """Two prepared datasets of distinct documents, 'a' with several shards."""
    root = tmp_path_factory.mktemp("tokens")
    paths = {}
    for name, count, seed in (("a", 300, 1), ("b", 120, 2)):
        (root / name).mkdir()
        (root / name / "docs.jsonl").write_text("".join(
            json.dumps({"text": d}) + "\n" for d in documents(count, seed)))
        prepare(root / name / "docs.jsonl", root / f"{name}_tokens", shard_mb=0.01, workers=0)
        paths[name] = str(root / f"{name}_tokens")
    return paths


def make(path=None, *, processes=(0, 1), **fields) -> TokensInput:
    data = TokensInput(path=path, **{"batch_size": 8, "seq_len": 64, **fields})
    data.shard(*processes)
    data.check()
    return data


def segments(batches) -> list[np.ndarray]:
    """The ids and the last label of every segment: a document's sequence or a piece of it."""
    out = []
    for b in batches:
        for r in range(len(b["ids"])):
            for s in np.unique(b["segment_ids"][r][b["segment_ids"][r] > 0]):
                cols = np.flatnonzero(b["segment_ids"][r] == s)
                assert (b["segment_pos"][r, cols] == np.arange(len(cols))).all()
                assert (b["ids"][r, cols[1:]] == b["labels"][r, cols[:-1]]).all()
                out.append(np.append(b["ids"][r, cols], b["labels"][r, cols[-1]]))
    return out


@pytest.mark.parametrize("batch_size", [8, 7])
def test_packed_evaluation_holds_every_document_once(prepared, batch_size):
    data = PreparedDataset.open(prepared["a"])
    batches = all_rows(make(prepared["a"], is_training=False, batch_size=batch_size))
    predictions = sum(b["weights"].sum() for b in batches)
    assert predictions == data.num_tokens + data.num_documents  # [bos, text, eos] each
    # A document's [bos, text, eos] is cut into pieces of 64 predictions (65 tokens, each piece
    # overlapping the next by one): the rows must hold exactly these pieces, each once.
    expected = collections.Counter()
    for ids in data.tokens(list(range(data.num_documents))):
        sequence = [BYTES.bos_id, *ids.tolist(), BYTES.eos_id]
        expected.update(tuple(sequence[k:k + 65]) for k in range(0, len(sequence) - 1, 64))
    assert collections.Counter(tuple(p.tolist()) for p in segments(batches)) == expected
    assert all(b["ids"].shape == (batch_size, 64) for b in batches)


def test_concatenated_rows_are_the_stream_in_order(prepared):
    data = PreparedDataset.open(prepared["a"])
    batches = all_rows(make(prepared["a"], is_training=False, packing="concat", batch_size=4))
    stream = np.concatenate([np.concatenate([[BYTES.bos_id], ids, [BYTES.eos_id]])
                             for ids in data.tokens(list(range(data.num_documents)))])
    rows = [(b["ids"][r], b["labels"][r], b["weights"][r]) for b in batches for r in range(4)]
    ids = np.concatenate([i[w > 0] for i, _, w in rows])
    assert (ids == stream[:-1]).all()
    assert (np.concatenate([lab[w > 0] for _, lab, w in rows]) == stream[1:]).all()


@pytest.mark.parametrize("count", [2, 4])
def test_processes_read_disjoint_parts_of_the_same_global_batches(prepared, count):
    whole = make(prepared["a"], seed=5)
    parts = [make(prepared["a"], seed=5, processes=(p, count)) for p in range(count)]
    for _ in range(6):
        expected = whole.get_next()
        got = [p.get_next() for p in parts]
        for key, value in expected.items():
            assert (np.concatenate([g[key] for g in got]) == value).all(), key
    assert all(p.get_state() == whole.get_state() for p in parts)


@pytest.mark.parametrize("packing", ["pack", "concat"])
def test_resume_continues_on_the_next_batch_on_any_process_count(prepared, packing):
    first = make(prepared["a"], seed=3, packing=packing)
    for _ in range(40):  # past the end of the first epoch (several blocks of documents)
        first.get_next()
    state = json.loads(json.dumps(first.get_state()))
    expected = [first.get_next() for _ in range(3)]
    for processes in ((0, 1), (1, 2)):
        again = make(prepared["a"], seed=3, processes=processes, packing=packing)
        again.set_state(state)
        rows = slice(processes[0] * 8 // processes[1], (processes[0] + 1) * 8 // processes[1])
        for batch in expected:
            got = again.get_next()
            assert all((got[k] == batch[k][rows]).all() for k in batch)


def test_epochs_are_shuffled_anew_and_seeds_differ(prepared):
    def order(seed, batches=40):
        data = make(prepared["b"], seed=seed, packing="concat")
        return np.concatenate([data.get_next()["ids"].ravel() for _ in range(batches)])

    assert (order(1) == order(1)).all()
    assert not (order(1) == order(2)).all()
    one_epoch = make(prepared["b"], seed=1, is_training=False, shuffle=True)
    first = [s.tobytes() for s in segments(all_rows(one_epoch))]
    trained = make(prepared["b"], seed=1)
    per_epoch = len(all_rows(make(prepared["b"], seed=1, is_training=False, shuffle=True)))
    epochs = [[s.tobytes() for s in segments([trained.get_next() for _ in range(per_epoch - 1)])]
              for _ in range(2)]
    assert epochs[0][:20] == first[:20] and epochs[1][:20] != first[:20]


def test_worker_processes_give_the_same_batches_and_positions(prepared):
    import multiprocessing

    plain = make(prepared["a"], seed=7)
    workers = make(prepared["a"], seed=7, num_workers=2)
    resumed = make(prepared["a"], seed=7, num_workers=2)
    try:
        for _ in range(5):
            a, b = plain.get_next(), workers.get_next()
            assert all((a[k] == b[k]).all() for k in a)
            assert plain.get_state() == workers.get_state()
        assert len(multiprocessing.active_children()) >= 2
        resumed.set_state(workers.get_state())
        for _ in range(3):
            a, b = plain.get_next(), resumed.get_next()
            assert all((a[k] == b[k]).all() for k in a)
    finally:
        for data in (workers, resumed):
            data.set_state(data.initial_state())  # stops the workers


def test_a_mixture_draws_documents_by_weight(prepared):
    mixed = TokensInput(mixture={prepared["a"]: 3.0, prepared["b"]: 1.0}, batch_size=8,
                        seq_len=64, packing="concat")
    mixed.shard(0, 1)
    text = b"".join(BYTES.decode(mixed.get_next()["ids"][r]).encode()
                    for _ in range(60) for r in range(8))
    from_a, from_b = text.count(b"doc 1."), text.count(b"doc 2.")
    assert 2.0 < from_a / from_b < 4.5
    for weight in (0.0, -1.0, float("nan")):
        with pytest.raises(UsageError, match="must be a number above 0"):
            TokensInput(mixture={prepared["a"]: 1.0, prepared["b"]: weight})
    with pytest.raises(UsageError, match="cannot be a finite input"):
        TokensInput(mixture={prepared["a"]: 1.0}, is_training=False)


def test_each_mistake_is_one_clear_line(prepared, tmp_path):
    with pytest.raises(UsageError, match="no such data directory"):
        make(str(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="not a prepared dataset"):
        make(str(tmp_path / "empty"))
    from pax_lm.tokenizers import train_sentencepiece

    model = train_sentencepiece(documents(200), tmp_path / "spm", vocab_size=300)
    from pax_lm.tokenizers import SentencePieceTokenizer

    with pytest.raises(UsageError, match="prepared with tokenizer bytes"):
        TokensInput(path=prepared["b"], tokenizer=SentencePieceTokenizer(model)).check()
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(prepared["b"], damaged)
    shard = sorted((damaged / "shards").iterdir())[0]
    whole = shard.read_bytes()
    shard.write_bytes(whole[:1000])
    with pytest.raises(UsageError, match="is damaged"):
        make(str(damaged))
    flipped = bytearray(whole)  # the same size, a byte of the first records changed
    flipped[2000] ^= 0xFF
    shard.write_bytes(bytes(flipped))
    data = PreparedDataset.open(damaged)
    with pytest.raises(UsageError, match=r"tokens-00000\.array_record is damaged"):
        data.verify_shard(0)
    with pytest.raises(UsageError, match="a shard is damaged"):
        data.tokens(list(range(data.shards[0].documents)))
    with pytest.raises(UsageError, match="give path"):
        make(None)


def test_a_position_of_other_rows_is_refused(prepared):
    trained = make(prepared["a"], seed=3)
    trained.get_next()
    state = trained.get_state()
    for changed in (dict(seed=4), dict(seq_len=32), dict(packing="concat")):
        other = make(prepared["a"], **{"seed": 3, **changed})
        with pytest.raises(UsageError, match="read from other data or settings"):
            other.set_state(state)
    with pytest.raises(UsageError, match="held its data in memory"):
        make(prepared["a"]).set_state({"next_index": 12})
    with pytest.raises(ValueError, match="not a position"):
        make(prepared["a"]).set_state({"position": "nowhere"})


def _train(job, *extra, processes: int = 1, steps: int = 20):
    """`pax train` of the tests' LM on prepared data, as 1 process x 8 devices or 2 x 4."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    pax = str(Path(sys.executable).with_name("pax"))
    command = [pax, "train", "--plugin", "lm", "--exp", "TinyLmForTests", "--job-dir", str(job),
               "--set", f"NUM_TRAIN_STEPS={steps}", "--set", "SUMMARY_INTERVAL_STEPS=5",
               "--set", "EVAL_INTERVAL_STEPS=10", "--set", "CHECKPOINT_EVERY_N_STEPS=10",
               *extra]
    if processes > 1:
        command = [pax, "launch", "--processes", str(processes), "--cpu-devices",
                   str(8 // processes), "--", *command]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAX_")}
    result = subprocess.run(command, capture_output=True, text=True, timeout=240,
                            env={**env, "PAX_STRICT_PLUGINS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    from pax_core.testing import read_metrics

    return {(r["kind"], r["step"]): r for r in read_metrics(job) if "loss" in r}


@pytest.mark.slow
def test_two_processes_train_as_one_and_resume_on_another_count(prepared, tmp_path):
    data = ["--set", f"TRAIN_DATA={{'{prepared['a']}': 2.0, '{prepared['b']}': 1.0}}",
            "--set", f"EVAL_DATA='{prepared['b']}'", "--set", "INPUT_WORKERS=1"]
    one = _train(tmp_path / "one", *data, steps=30)
    two = _train(tmp_path / "two", *data, processes=2, steps=20)
    for key, record in two.items():
        assert record["loss"] == pytest.approx(one[key]["loss"], abs=1e-5), key
    evaluation = PreparedDataset.open(prepared["b"])
    assert two["eval/heldout", 20]["num_predictions"] == (
        evaluation.num_tokens + evaluation.num_documents)
    # The 2-process job goes on as 1 process, exactly as the 1-process run did.
    resumed = _train(tmp_path / "two", *data, steps=30)
    for step in (25, 30):
        assert resumed["train", step]["loss"] == pytest.approx(one["train", step]["loss"],
                                                               abs=1e-5)
