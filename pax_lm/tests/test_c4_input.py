"""Pax's C4 experiments on small samples in C4's own layouts: TFDS's ArrayRecord files are read
as they are (and give the same batches as the same documents prepared from C4's JSON release,
which is answered with the commands that prepare it), and a C4 experiment trains on them end to
end (worker processes on, evaluation over the whole validation split)."""

import gzip
import json

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordWriter
from test_text_input import all_rows

from pax_core import UsageError, make_tf_example
from pax_core.testing import read_metrics, run_pax
from pax_lm.corpus import default_corpus
from pax_lm.inputs.c4 import C4Input
from pax_lm.preparation import prepare
from pax_lm.tokenizers import train_sentencepiece

# Shards of each split, as C4 names them, and the chapters of the default corpus they hold.
SPLITS = {("train", 0, 2): slice(0, 150), ("train", 1, 2): slice(150, 300),
          ("validation", 0, 1): slice(300, 330)}


def record(text: str, i: int) -> dict[str, str]:
    return {"text": text, "timestamp": "2019-04-25T12:57:54Z", "url": f"https://example.org/{i}"}


@pytest.fixture(scope="module")
def c4(tmp_path_factory) -> dict[str, str]:
    """The same documents in C4's JSON release and in TFDS's c4/en layout, and an SPM model."""
    root = tmp_path_factory.mktemp("c4")
    chapters = default_corpus()
    (root / "json").mkdir()
    (root / "tfds").mkdir()
    for (split, shard, count), chosen in SPLITS.items():
        texts = chapters[chosen]
        with gzip.open(root / "json" / f"c4-{split}.{shard:05d}-of-{count:05d}.json.gz", "wt") as f:
            f.writelines(json.dumps(record(t, i)) + "\n" for i, t in enumerate(texts))
        name = f"c4-{split}.array_record-{shard:05d}-of-{count:05d}"
        writer = ArrayRecordWriter(str(root / "tfds" / name), "group_size:1")
        for i, text in enumerate(texts):
            writer.write(make_tf_example(**record(text, i)))
        writer.close()
    model = train_sentencepiece(chapters[:300], root / "spm", vocab_size=400)
    return {"json": str(root / "json"), "tfds": str(root / "tfds"), "model": model,
            "prepared": str(root / "prepared")}


def c4_input(c4, layout: str, **fields) -> C4Input:
    data = C4Input(data_dir=c4[layout], spm_model=c4["model"], batch_size=8, seq_len=64,
                   **fields)
    data.shard(0, 1)
    data.check()
    return data


def test_tfds_layout_reads_as_the_prepared_json_release(c4, tmp_path):
    with pytest.raises(UsageError, match=r"holds C4's JSON release, which has no random access"
                                         r".*pax data prepare .* --pattern 'c4-train"):
        c4_input(c4, "json")
    for split in ("train", "validation"):
        prepare(c4["json"], f"{c4['prepared']}/{split}", tokenizer=c4["model"],
                pattern=f"c4-{split}.*.json*", workers=0)
    tfds, prepared = c4_input(c4, "tfds", seed=3), c4_input(c4, "prepared", seed=3)
    for _ in range(30):  # past the first epoch
        a, b = tfds.get_next(), prepared.get_next()
        assert all((a[k] == b[k]).all() for k in a)
    fields = dict(c4_split="validation", is_training=False)
    evaluated = [all_rows(c4_input(c4, layout, **fields)) for layout in ("tfds", "prepared")]
    assert len(evaluated[0]) == len(evaluated[1])
    for a, b in zip(*evaluated, strict=True):
        assert all((a[k] == b[k]).all() for k in a)
    with pytest.raises(UsageError, match=r"neither TFDS's c4-train\.array_record"):
        C4Input(data_dir=str(tmp_path), spm_model=c4["model"]).check()


@pytest.mark.slow
def test_c4_experiment_trains_on_tfds_files(c4, tmp_path):
    job = tmp_path / "job"
    tiny = ["NUM_LAYERS=2", "MODEL_DIMS=64", "HIDDEN_DIMS=128", "NUM_HEADS=2",
            "DIMS_PER_HEAD=32", "VOCAB_SIZE=400", "MAX_SEQ_LEN=64", "PERCORE_BATCH_SIZE=1",
            "ICI_MESH_SHAPE=[1,8,1]", "NUM_TRAIN_STEPS=30", "EVAL_INTERVAL_STEPS=30",
            "SUMMARY_INTERVAL_STEPS=5", "CHECKPOINT_EVERY_N_STEPS=15", "LEARNING_RATE=3e-3",
            "INPUT_WORKERS=1", f"C4_DATA_DIR='{c4['tfds']}'", f"C4_SPM_MODEL='{c4['model']}'"]
    sets = [a for item in tiny for a in ("--set", item)]
    result = run_pax("train", "--plugin", "lm", "--exp", "C4Spmd1BAdam4Replicas", "--job-dir",
                     str(job), *sets, timeout=300)
    assert result.returncode == 0, result.stderr
    records = read_metrics(job)
    losses = [r["loss"] for r in records if r.get("kind") == "train"]
    assert losses[-1] < losses[0] - 0.1
    evaluation = next(r for r in records if r.get("kind") == "eval/validation")
    tokenizer = C4Input(spm_model=c4["model"]).tokenizer
    texts = default_corpus()[SPLITS["validation", 0, 1]]
    tokens = sum(len(ids) for ids in tokenizer.encode_batch(texts))
    # Concatenated [bos, text, eos] sequences: every prediction of the stream counted once.
    assert evaluation["num_predictions"] == tokens + 2 * len(texts) - 1
    assert np.isfinite(evaluation["log_pplx"])
