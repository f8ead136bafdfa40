"""Every test sees 8 fake CPU devices: set before anything imports JAX. ``c4_standin`` is a small
stand-in for C4, which no test machine has, in the format Pax's C4 experiments read it in, so
that their input is checked in CI."""

from __future__ import annotations

from pathlib import Path

import pytest

from pax_core.testing import use_cpu_devices

use_cpu_devices(8)

# Chapters of the default corpus in each split of the C4 stand-in, as (split, shard, shards):
# 36 KB of training text and 10 KB of validation text, a document per verse. Hundreds of
# documents rather than a dozen chapters: grain's shuffle costs about a millisecond a document
# for a dozen (tens of microseconds for hundreds, a few for C4's 365 million).
C4_STANDIN_SPLITS = {("train", 0, 2): slice(0, 6), ("train", 1, 2): slice(6, 12),
                     ("validation", 0, 1): slice(12, 16)}


@pytest.fixture(scope="session")
def c4_standin(tmp_path_factory) -> dict[str, Path]:
    """C4 as ``C4_DATA_DIR`` and ``C4_SPM_MODEL`` name it: ``data`` a TFDS ``c4/en/3.1.0``
    folder of ArrayRecord shards of serialized ``tf.train.Example`` records (``text``, ``url``,
    ``timestamp``; two training shards, one validation shard), ``model`` a SentencePiece model
    of 400 pieces trained on the training text. A fraction of a second to write, so each
    xdist worker writes its own."""
    from array_record.python.array_record_module import ArrayRecordWriter

    from pax_core import make_tf_example
    from pax_lm.corpus import default_corpus
    from pax_lm.tokenizers import train_sentencepiece

    root = tmp_path_factory.mktemp("c4")
    folder = root / "c4" / "en" / "3.1.0"
    folder.mkdir(parents=True)
    chapters = default_corpus()
    train = []
    for (split, shard, shards), chosen in C4_STANDIN_SPLITS.items():
        documents = [verse for chapter in chapters[chosen] for verse in chapter.splitlines()]
        if split == "train":
            train += documents
        name = f"c4-{split}.array_record-{shard:05d}-of-{shards:05d}"
        writer = ArrayRecordWriter(str(folder / name), "group_size:1")
        for i, text in enumerate(documents):
            writer.write(make_tf_example(text=text, url=f"https://example.org/{split}/{i}",
                                         timestamp="2019-04-25T12:57:54Z"))
        writer.close()
    model = train_sentencepiece(train, root / "spm", vocab_size=400)
    return {"data": folder, "model": Path(model)}
