"""SeqIO tasks over text files the tests write: nothing is downloaded.

``write_corpus(folder)`` writes short, distinct English-like sentences (seeded, so every run
writes the same files); ``register(folder)`` registers SeqIO tasks and a mixture over them,
byte-level (``seqio.ByteVocabulary``). A ``pax train`` subprocess registers them by importing
this module (an experiment's ``module_imports``) with ``PAX_SEQIO_TEST_DATA`` naming the folder.
"""

from __future__ import annotations

import functools
import itertools
import os
from pathlib import Path

import numpy as np
import seqio
import tensorflow as tf

TASK = "pax_seqio_test_text"            # train: 4 files, validation: 1 file
ONE_FILE_TASK = "pax_seqio_test_one_file"  # train: 1 file (SeqIO shards it by example)
MISSING_FILES_TASK = "pax_seqio_test_missing_files"
MIXTURE = "pax_seqio_test_mixture"
TRAIN_FILES = 4
LINES_PER_TRAIN_FILE = 60
VALIDATION_LINES = 25
ONE_FILE_LINES = 30
VOCABULARY = seqio.ByteVocabulary()

_ADJECTIVES = ("red", "old", "quick", "small", "green", "tall", "quiet", "bright")
_NOUNS = ("fox", "dog", "king", "bird", "river", "stone", "child", "horse")
_VERBS = ("sees", "follows", "finds", "loves", "hears", "keeps")


def sentences() -> list[str]:
    """Every distinct sentence of the tiny grammar, in a seeded order."""
    lines = [f"the {a} {n} {v} the {m}." for a, n, v, m in
             itertools.product(_ADJECTIVES, _NOUNS, _VERBS, _NOUNS) if n != m]
    order = np.random.default_rng(0).permutation(len(lines))
    return [lines[i] for i in order]


def write_corpus(folder: str | os.PathLike) -> dict[str, list[str]]:
    """Write the files of every task into ``folder``; returns each split's lines."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lines = iter(sentences())
    splits: dict[str, list[str]] = {"train": [], "validation": [], "one_file": []}
    for i in range(TRAIN_FILES):
        chunk = list(itertools.islice(lines, LINES_PER_TRAIN_FILE))
        (folder / f"train-{i}.txt").write_text("\n".join(chunk) + "\n")
        splits["train"] += chunk
    for split, count, name in (("validation", VALIDATION_LINES, "validation.txt"),
                               ("one_file", ONE_FILE_LINES, "one_file.txt")):
        chunk = list(itertools.islice(lines, count))
        (folder / name).write_text("\n".join(chunk) + "\n")
        splits[split] = chunk
    return splits


def _as_targets(ds: tf.data.Dataset) -> tf.data.Dataset:
    return ds.map(lambda line: {"targets": line})


def _add(name: str, split_to_files: dict[str, str | list[str]]) -> None:
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
        name,
        source=seqio.TextLineDataSource(split_to_files),
        preprocessors=[_as_targets,
                       functools.partial(seqio.preprocessors.tokenize, copy_pretokenized=False),
                       seqio.CacheDatasetPlaceholder(),
                       seqio.preprocessors.append_eos_after_trim],
        output_features={"targets": seqio.Feature(VOCABULARY, add_eos=True)},
    )


def register(folder: str | os.PathLike) -> None:
    """Register the tasks and the mixture over the files of ``folder`` (again: replaced)."""
    folder = Path(folder)
    _add(TASK, {"train": [str(folder / f"train-{i}.txt") for i in range(TRAIN_FILES)],
                "validation": str(folder / "validation.txt")})
    _add(ONE_FILE_TASK, {"train": str(folder / "one_file.txt")})
    _add(MISSING_FILES_TASK, {"train": str(folder / "absent-*.txt")})
    seqio.MixtureRegistry.remove(MIXTURE)
    seqio.MixtureRegistry.add(MIXTURE, [(TASK, 1.0), (ONE_FILE_TASK, 1.0)])


if os.environ.get("PAX_SEQIO_TEST_DATA"):
    register(os.environ["PAX_SEQIO_TEST_DATA"])
