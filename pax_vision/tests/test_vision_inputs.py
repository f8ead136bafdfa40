"""pax-vision's inputs: the sources read what they should and refuse what they cannot read, and
the stream is seeded, shared out over processes, resumable and padded for evaluation."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest
from PIL import Image

from pax_core import UsageError, make_tf_example
from pax_vision.inputs.arrays import IDX_IMAGES, IDX_LABELS, DigitsInput, IdxInput
from pax_vision.inputs.encoded import ImageFolderInput, TfdsImageInput
from pax_vision.inputs.transforms import augment, centre_crop


def _write_idx(path, magic, array, compress=True):
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    with (gzip.open if compress else open)(path, "wb") as f:
        f.write(data)


@pytest.fixture
def idx_folder(tmp_path):
    """Ten 6x6 images per split whose pixels all equal their index, labelled index % 4."""
    rng = np.arange(10)
    for stem in ("train", "t10k"):
        _write_idx(tmp_path / f"{stem}-images-idx3-ubyte.gz", IDX_IMAGES,
                   np.broadcast_to(rng[:, None, None], (10, 6, 6)))
        _write_idx(tmp_path / f"{stem}-labels-idx1-ubyte.gz", IDX_LABELS, rng % 4)
    return tmp_path


def _ids(batch):
    """Which examples a batch holds (the fixture's pixels name them)."""
    return [int(image[0, 0, 0]) if w else -1 for image, w in zip(batch["image"],
                                                                  batch["weight"], strict=True)]


def test_idx_reads_images_and_labels(idx_folder):
    data = IdxInput(folder=str(idx_folder), batch_size=4, is_training=False, num_classes=4)
    data.check()
    batch = data.get_next()
    assert batch["image"].shape == (4, 6, 6, 1) and batch["image"].dtype == np.uint8
    assert _ids(batch) == [0, 1, 2, 3] and list(batch["label"]) == [0, 1, 2, 3]


def test_eval_reads_everything_once_then_pads_and_stops(idx_folder):
    data = IdxInput(folder=str(idx_folder), split="test", batch_size=4, is_training=False)
    batches = []
    with pytest.raises(StopIteration):
        while True:
            batches.append(data.get_next())
    assert [_ids(b) for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, -1, -1]]
    assert batches[-1]["weight"].tolist() == [1, 1, 0, 0]
    data.reset()
    assert _ids(data.get_next()) == [0, 1, 2, 3]


def test_training_order_is_seeded_new_every_epoch_and_resumes(idx_folder):
    def stream(seed, n):
        data = IdxInput(folder=str(idx_folder), batch_size=5, seed=seed)
        return [_ids(data.get_next()) for _ in range(n)]

    first = stream(1, 4)
    assert first == stream(1, 4) and first != stream(2, 4)
    epochs = [first[0] + first[1], first[2] + first[3]]
    assert all(sorted(e) == list(range(10)) for e in epochs) and epochs[0] != epochs[1]
    data = IdxInput(folder=str(idx_folder), batch_size=5, seed=1)
    data.get_next()
    saved = json.loads(json.dumps(data.get_state()))
    resumed = IdxInput(folder=str(idx_folder), batch_size=5, seed=1)
    resumed.set_state(saved)
    assert [_ids(resumed.get_next()) for _ in range(3)] == first[1:]
    other = IdxInput(folder=str(idx_folder), batch_size=5, seed=2)
    with pytest.raises(UsageError, match="other data or settings"):
        other.set_state(saved)


def test_processes_serve_their_rows_of_the_same_global_batch(idx_folder):
    whole = IdxInput(folder=str(idx_folder), batch_size=4, augment=True, image_size=4)
    parts = [IdxInput(folder=str(idx_folder), batch_size=4, augment=True, image_size=4)
             for _ in range(2)]
    for p, part in enumerate(parts):
        part.shard(p, 2)
    for _ in range(3):
        batch, halves = whole.get_next(), [part.get_next() for part in parts]
        for key in batch:
            np.testing.assert_array_equal(batch[key], np.concatenate([h[key] for h in halves]))


def test_worker_processes_give_the_same_batches(idx_folder):
    here = IdxInput(folder=str(idx_folder), batch_size=3, augment=True, image_size=4)
    workers = IdxInput(folder=str(idx_folder), batch_size=3, augment=True, image_size=4,
                       num_workers=2)
    try:
        for _ in range(5):
            a, b = here.get_next(), workers.get_next()
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])
        assert workers.get_state() == here.get_state()
    finally:
        workers.close()


def test_idx_of_the_wrong_magic_number_is_refused(idx_folder):
    _write_idx(idx_folder / "train-images-idx3-ubyte.gz", IDX_LABELS, np.zeros(10))
    with pytest.raises(UsageError, match="magic number 2049, expected 2051"):
        IdxInput(folder=str(idx_folder), batch_size=2).check()


def test_truncated_idx_is_refused(idx_folder):
    path = idx_folder / "train-labels-idx1-ubyte.gz"
    with gzip.open(path) as f:
        data = f.read()
    with gzip.open(path, "wb") as f:
        f.write(data[:-3])
    with pytest.raises(UsageError, match="truncated or damaged"):
        IdxInput(folder=str(idx_folder), batch_size=2).check()


def test_a_class_count_other_than_the_models_is_refused(idx_folder):
    with pytest.raises(UsageError, match="the data has 4 classes but the model has 10"):
        IdxInput(folder=str(idx_folder), batch_size=2, num_classes=10).check()


def test_digits_split_is_fixed_and_disjoint():
    pytest.importorskip("sklearn")
    train, test = DigitsInput(split="train"), DigitsInput(split="test")
    assert (train.source().num_examples, test.source().num_examples) == (1437, 360)
    assert train.source().num_classes == test.source().num_classes == 10
    seen = {train.source().images[i].tobytes() for i in range(1437)}
    overlap = sum(test.source().images[i].tobytes() in seen for i in range(360))
    assert overlap < 10  # a handful of digits are drawn identically


@pytest.fixture
def image_folder(tmp_path):
    rng = np.random.default_rng(0)
    for name, size in (("cat", (20, 30)), ("dog", (24, 24))):
        (tmp_path / name).mkdir()
        for i in range(3):
            pixels = rng.integers(0, 255, (*size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / name / f"{i}.{'png' if i else 'jpg'}")
    return tmp_path


def test_folder_classes_are_its_subfolders(image_folder):
    data = ImageFolderInput(root=str(image_folder), batch_size=6, image_size=16,
                            is_training=False, num_classes=2)
    data.check()
    batch = data.get_next()
    assert data.classes() == ("cat", "dog")
    assert batch["image"].shape == (6, 16, 16, 3) and list(batch["label"]) == [0] * 3 + [1] * 3


def test_folder_without_class_subfolders_is_refused(tmp_path):
    Image.new("RGB", (4, 4)).save(tmp_path / "a.png")
    with pytest.raises(UsageError, match="no class subfolders"):
        ImageFolderInput(root=str(tmp_path), batch_size=1, image_size=4).check()


def test_folder_of_many_sizes_needs_an_image_size(image_folder):
    with pytest.raises(UsageError, match="set image_size"):
        ImageFolderInput(root=str(image_folder), batch_size=1).check()


def test_undecodable_image_is_skipped_with_a_count_or_stops_the_run(image_folder, capsys):
    good = (image_folder / "dog" / "1.png").read_bytes()
    (image_folder / "dog" / "1.png").write_bytes(good[: len(good) // 2])  # truncated
    common = dict(root=str(image_folder), batch_size=6, image_size=8, is_training=False)
    skipping = ImageFolderInput(**common)
    batch = skipping.get_next()
    assert batch["weight"].tolist() == [1, 1, 1, 1, 0, 1]
    assert "skipped " + str(image_folder / "dog" / "1.png") in capsys.readouterr().err
    with pytest.raises(UsageError, match=r"cannot read .*dog/1\.png"):
        ImageFolderInput(on_bad_image="stop", **common).check()


def test_tfds_records_are_read_without_tensorflow(tmp_path):
    from array_record.python.array_record_module import ArrayRecordWriter

    images = []
    name = "imagenet2012-validation.array_record-00000-of-00001"
    writer = ArrayRecordWriter(str(tmp_path / name), "group_size:1")
    for label in range(3):
        pixels = np.full((10, 12, 3), 40 * label, np.uint8)
        encoded = tmp_path / "x.png"
        Image.fromarray(pixels).save(encoded)
        images.append(pixels)
        writer.write(make_tf_example(image=encoded.read_bytes(), label=label))
    writer.close()
    (tmp_path / "label.labels.txt").write_text("n01\nn02\nn03\n")
    data = TfdsImageInput(folder=str(tmp_path), split="validation", batch_size=4, image_size=8,
                          is_training=False, num_classes=3)
    data.check()
    batch = data.get_next()
    assert data.classes() == ("n01", "n02", "n03")
    assert batch["label"].tolist() == [0, 1, 2, 0] and batch["weight"].tolist() == [1, 1, 1, 0]
    assert batch["image"][2].min() == batch["image"][2].max() == 80


def test_transforms_keep_size_and_draw_from_their_generator():
    image = np.random.default_rng(0).integers(0, 255, (40, 60, 3), dtype=np.uint8)
    assert centre_crop(image, 16).shape == (16, 16, 3)
    np.testing.assert_array_equal(centre_crop(image[:16, :16], 16), image[:16, :16])
    a = augment(image, 16, np.random.default_rng(1), (0.08, 1.0), True)
    b = augment(image, 16, np.random.default_rng(1), (0.08, 1.0), True)
    c = augment(image, 16, np.random.default_rng(2), (0.08, 1.0), True)
    assert a.shape == (16, 16, 3)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
