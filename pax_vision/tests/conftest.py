"""Every test sees 8 fake CPU devices: set before anything imports JAX. ``fashion_mnist_standin``
and ``imagenet_standin`` are small stand-ins for data no test machine has, written in the real
data's format (IDX files as Debian's dataset-fashion-mnist installs them; TFDS's built
``imagenet2012`` folder), so that the inputs that read those formats are checked in CI."""

from __future__ import annotations

import gzip
import io

import numpy as np
import pytest

from pax_core.testing import use_cpu_devices

use_cpu_devices(8)

IMAGENET_CLASSES = 1000


def write_idx(path, magic: int, array: np.ndarray) -> None:
    """``array`` as a gzip-compressed IDX file: the magic number, each dimension as a 4-byte
    big-endian count, then the bytes."""
    header = magic.to_bytes(4, "big") + b"".join(d.to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.fixture(scope="session")
def fashion_mnist_standin(tmp_path_factory):
    """A folder of the four Fashion-MNIST files: 96 training and 160 test images of 28x28
    noise, labelled 0-9 in turn (so the data has Fashion-MNIST's ten classes)."""
    from pax_vision.inputs.arrays import IDX_IMAGES, IDX_LABELS

    folder = tmp_path_factory.mktemp("fashion-mnist")
    rng = np.random.default_rng(0)
    for stem, count in (("train", 96), ("t10k", 160)):
        write_idx(folder / f"{stem}-images-idx3-ubyte.gz", IDX_IMAGES,
                  rng.integers(0, 256, (count, 28, 28)))
        write_idx(folder / f"{stem}-labels-idx1-ubyte.gz", IDX_LABELS, np.arange(count) % 10)
    return folder


def _jpeg(rng: np.random.Generator) -> bytes:
    from PIL import Image

    height, width = rng.integers(24, 48, size=2)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
    return out.getvalue()


@pytest.fixture(scope="session")
def imagenet_standin(tmp_path_factory):
    """A TFDS ``imagenet2012`` version folder as ``tfds build`` writes it: ``label.labels.txt``
    naming 1,000 classes and ArrayRecord shards of serialized ``tf.train.Example`` records
    (``image``: JPEG bytes of its own size, ``label``: int64, ``file_name``), 24 training
    records in two shards and 12 validation records in one."""
    from array_record.python.array_record_module import ArrayRecordWriter

    from pax_core import make_tf_example

    folder = tmp_path_factory.mktemp("imagenet2012") / "5.1.0"
    folder.mkdir()
    (folder / "label.labels.txt").write_text(
        "".join(f"n{i:08d}\n" for i in range(IMAGENET_CLASSES)))
    rng = np.random.default_rng(0)
    for split, shards, per_shard in (("train", 2, 12), ("validation", 1, 12)):
        for shard in range(shards):
            name = f"imagenet2012-{split}.array_record-{shard:05d}-of-{shards:05d}"
            writer = ArrayRecordWriter(str(folder / name), "group_size:1")
            for i in range(per_shard):
                label = int(rng.integers(IMAGENET_CLASSES))
                writer.write(make_tf_example(image=_jpeg(rng), label=label,
                                             file_name=f"n{label:08d}_{shard}{i:03d}.JPEG"))
            writer.close()
    return folder
