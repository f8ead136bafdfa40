"""SeqIOInput on SeqIO tasks over local text files: the batches pax-lm reads, the per-process
shards, the position, the eval padding and the user's mistakes."""

from __future__ import annotations

import collections
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import seqio_test_tasks as tasks

from pax_core import UsageError
from pax_seqio.inputs import BATCH_KEYS, SeqIOInput

SEQ_LEN = 48  # longer than every sentence and its eos: no example is trimmed


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, list[str]]:
    folder = tmp_path_factory.mktemp("seqio_corpus")
    lines = tasks.write_corpus(folder)
    tasks.register(folder)
    return lines


def make(process: tuple[int, int] = (0, 1), **fields) -> SeqIOInput:
    """An input as the core leaves it after ``shard``."""
    fields = {"mixture_or_task_name": tasks.TASK, "task_feature_lengths": {"targets": SEQ_LEN},
              "batch_size": 4, **fields}
    data = SeqIOInput(**fields)
    data.shard(*process)
    return data


def texts(batch: dict[str, np.ndarray]) -> list[str]:
    """The sentences in a batch: one per segment of weighted tokens (padding rows give none)."""
    out = []
    for labels, weights, segments in zip(batch["labels"], batch["weights"],
                                         batch["segment_ids"], strict=True):
        for segment in np.unique(segments[weights > 0]):
            tokens = labels[(segments == segment) & (weights > 0)]
            out.append(tasks.VOCABULARY.decode([int(t) for t in tokens]))
    return out


def read_all(data: SeqIOInput) -> list[dict[str, np.ndarray]]:
    batches = []
    while True:
        try:
            batches.append(data.get_next())
        except StopIteration:
            return batches


def test_batches_have_the_keys_shapes_and_dtypes_of_pax_lm(corpus):
    for data in (make(), make(is_training=False)):
        batch = data.get_next()
        assert set(batch) == set(BATCH_KEYS)
        for key, value in batch.items():
            assert value.shape == (4, SEQ_LEN), key
            assert value.dtype == (np.float32 if key == "weights" else np.int32), key
        spec = data.abstract_batch()
        assert {k: (v.shape, v.dtype) for k, v in spec.items()} == {
            k: (v.shape, v.dtype) for k, v in batch.items()}
        # Next-token pairs within each segment: an input token is the previous label.
        same = (batch["segment_ids"][:, 1:] == batch["segment_ids"][:, :-1]) & (
            batch["weights"][:, 1:] > 0)
        assert np.array_equal(batch["ids"][:, 1:][same], batch["labels"][:, :-1][same])
        assert set(texts(batch)) <= set(corpus["train"])


def test_unpacked_rows_are_one_segment_with_positions_from_zero(corpus):
    batch = make(is_training=False).get_next()
    assert np.array_equal(batch["segment_ids"], (batch["weights"] > 0).astype(np.int32))
    assert np.array_equal(batch["segment_pos"], np.broadcast_to(np.arange(SEQ_LEN), (4, SEQ_LEN)))
    assert texts(batch) == corpus["train"][:4]  # unshuffled: the first file's first lines


def test_packed_rows_restart_positions_at_every_segment(corpus):
    data = make(task_feature_lengths={"targets": 96})  # two or more sentences a row
    batch = data.get_next()
    assert batch["segment_ids"].max() >= 2
    for segments, positions in zip(batch["segment_ids"], batch["segment_pos"], strict=True):
        for segment in np.unique(segments[segments > 0]):
            assert np.array_equal(positions[segments == segment],
                                  np.arange((segments == segment).sum()))
    assert set(texts(batch)) <= set(corpus["train"])


@pytest.mark.parametrize("task", [tasks.TASK, tasks.ONE_FILE_TASK])
def test_two_processes_read_disjoint_shards_that_make_the_whole(corpus, task):
    """By file (4 files) or by example (1 file): each example is read by exactly one process."""
    def examples(process):
        return [t for b in read_all(make(process, mixture_or_task_name=task, is_training=False))
                for t in texts(b)]

    whole = examples((0, 1))
    first, second = examples((0, 2)), examples((1, 2))
    assert not set(first) & set(second)
    assert sorted(first + second) == sorted(whole)
    assert sorted(whole) == sorted(corpus["train" if task == tasks.TASK else "one_file"])


def test_training_streams_of_two_processes_are_disjoint(corpus):
    first, second = make((0, 2), batch_size=8), make((1, 2), batch_size=8)
    seen = [{t for _ in range(5) for t in texts(d.get_next())} for d in (first, second)]
    assert seen[0] and seen[1] and not seen[0] & seen[1]


def test_resume_continues_with_the_exact_next_batch(corpus):
    """Across an epoch's end (30 batches a shard), on a rebuilt input and on the same one."""
    data = make((1, 2), batch_size=8)
    for _ in range(28):
        data.get_next()
    state = json.loads(json.dumps(data.get_state()))
    assert state["batches"] == 28 and state["process_count"] == 2
    expected = [data.get_next() for _ in range(5)]
    for resumed in (make((1, 2), batch_size=8), data):
        resumed.set_state(state)
        for want in expected:
            got = resumed.get_next()
            assert all(np.array_equal(got[k], want[k]) for k in BATCH_KEYS)


def test_peek_and_reset_give_the_first_batch_again(corpus):
    data = make(is_training=False)
    first = data.peek()
    assert np.array_equal(data.get_next()["labels"], first["labels"])
    data.get_next()
    data.reset()
    assert np.array_equal(data.get_next()["labels"], first["labels"])


def test_a_position_saved_with_another_process_count_is_refused(corpus):
    saved = make((0, 2), batch_size=8)
    saved.get_next()
    data = make((0, 1), batch_size=8)
    with pytest.raises(UsageError, match=r"from a run of 2 process\(es\), this run has 1") as e:
        data.set_state(saved.get_state())
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("batch_size", "processes"), [(5, 1), (4, 1), (2, 2), (8, 2), (6, 2)])
def test_eval_counts_every_example_exactly_once(corpus, batch_size, processes):
    """25 sentences: batch sizes that divide them and that do not, on 1 and 2 processes (13 and
    12 examples); every process reads as many batches as the largest shard needs."""
    counts, seen = [], collections.Counter()
    for p in range(processes):
        data = make((p, processes), is_training=False, split_name="validation",
                    batch_size=batch_size)
        batches = read_all(data)
        counts.append(len(batches))
        for batch in batches:
            assert batch["ids"].shape == (batch_size // processes, SEQ_LEN)
            padding = batch["weights"].sum(axis=1) == 0
            assert not batch["labels"][padding].any() and not batch["segment_ids"][padding].any()
            seen.update(texts(batch))
        data.reset()
        assert len(read_all(data)) == len(batches)
    assert len(set(counts)) == 1
    assert seen == collections.Counter(corpus["validation"])
    largest_shard = 13 if processes == 2 else 25
    assert counts[0] == math.ceil(largest_shard / (batch_size // processes))


def test_a_mixture_reads_from_its_tasks(corpus):
    data = make(mixture_or_task_name=tasks.MIXTURE, batch_size=8)
    seen = {t for _ in range(8) for t in texts(data.get_next())}
    assert seen & set(corpus["train"]) and seen & set(corpus["one_file"])


def test_abstract_batch_reads_no_data(corpus):
    data = make(mixture_or_task_name=tasks.MISSING_FILES_TASK, batch_size=8)
    assert data.abstract_batch()["ids"].shape == (8, SEQ_LEN)
    with pytest.raises(UsageError, match="No file is found"):
        data.get_next()


@pytest.mark.parametrize(("fields", "message"), [
    ({"mixture_or_task_name": "pax_seqio_test_txt"},
     r"no SeqIO task or mixture named 'pax_seqio_test_txt'; close registered names: "
     r"pax_seqio_test_text"),
    ({"module_imports": ("seqio_tasks_that_do_not_exist",)},
     r"module_imports: cannot import 'seqio_tasks_that_do_not_exist' \(ModuleNotFoundError"),
    ({"split_name": "test"},
     r"task 'pax_seqio_test_text' has no split 'test'; its splits: train, validation"),
    ({"task_feature_lengths": {"inputs": 32}},
     r"task_feature_lengths has no length for 'targets'"),
    ({"task_feature_lengths": {"targets": 32, "inputs": 32}},
     r"names 'inputs', which SeqIO task 'pax_seqio_test_text' does not have"),
    ({"task_feature_lengths": {"targets": 0}}, r"must be a positive integer"),
    ({"task_feature_lengths": 32}, r"task_feature_lengths must be a dict"),
    ({"feature_converter": "enc_dec"}, r"feature_converter must be one of lm"),
    ({"mixture_or_task_name": ""}, r"mixture_or_task_name is empty"),
    ({"is_training": False, "repeat": True, "eval_num_batches": -1}, r"never ends"),
])
def test_bad_input_is_one_usage_error_line(corpus, fields, message):
    with pytest.raises(UsageError, match=message) as e:
        make(**fields)
    assert "\n" not in str(e.value)


def test_the_entry_module_and_the_input_module_load_no_tensorflow():
    code = ("import sys, pax_seqio.plugin, pax_seqio.inputs; "
            "print(sorted(m for m in ('tensorflow', 'seqio') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"
