"""Inputs whose images fit in memory as one array: MNIST-format IDX files and scikit-learn's
bundled UCI handwritten digits."""

from __future__ import annotations

import dataclasses
import gzip
from pathlib import Path
from typing import ClassVar

import numpy as np

from pax_core import UsageError, fingerprint
from pax_vision.inputs.base import ImageInput

IDX_IMAGES, IDX_LABELS = 2051, 2049  # the magic numbers of idx3 (images) and idx1 (labels)
IDX_SPLITS = {"train": "train", "test": "t10k"}
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot")


class ArraySource:
    """Images ``uint8 [N, H, W, C]`` and labels ``[N]`` held in memory."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, class_names: tuple[str, ...],
                 identity: str):
        self.images, self.labels = images, labels.astype(np.int32)
        self.num_examples = len(labels)
        self.num_classes = int(labels.max()) + 1 if len(labels) else 0
        self.class_names = tuple(class_names)
        self.image_size = images.shape[1] if images.shape[1] == images.shape[2] else 0
        self.fingerprint = fingerprint(identity, self.num_examples, self.num_classes)

    def example(self, index: int) -> tuple[np.ndarray, int]:
        return self.images[index], int(self.labels[index])


def read_idx(path: Path, magic: int) -> np.ndarray:
    """The array of an IDX file (gzip-compressed or not), its magic number checked."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise UsageError(f"{path}: cannot read it ({e})") from None
    found = int.from_bytes(data[:4], "big") if len(data) >= 4 else None
    if found != magic:
        kind = "image (idx3)" if magic == IDX_IMAGES else "label (idx1)"
        raise UsageError(f"{path}: not an IDX {kind} file: magic number {found}, expected "
                         f"{magic}; give the folder of MNIST-format files")
    dims = magic & 0xFF
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    body = np.frombuffer(data, np.uint8, offset=4 + 4 * dims)
    if body.size != int(np.prod(shape)):
        raise UsageError(f"{path}: holds {body.size} values, its header says {shape}; the file "
                         f"is truncated or damaged")
    return body.reshape(shape)


def _idx_file(folder: Path, stem: str) -> Path:
    for name in (f"{stem}.gz", stem):
        if (folder / name).is_file():
            return folder / name
    raise UsageError(f"{folder}: no {stem}[.gz]; give the folder that holds the MNIST-format "
                     f"IDX files (Fashion-MNIST: apt install dataset-fashion-mnist puts them in "
                     f"/usr/share/datasets/fashion-mnist)")


@dataclasses.dataclass
class IdxInput(ImageInput):
    """MNIST or Fashion-MNIST from the IDX files in ``folder``: ``split`` ``train``
    (``train-images-idx3-ubyte[.gz]``, ``train-labels-idx1-ubyte[.gz]``) or ``test``
    (``t10k-...``). ``class_names`` name the labels (Fashion-MNIST's are in
    ``FASHION_MNIST_CLASSES``)."""

    CHANNELS: ClassVar[int] = 1

    folder: str = "/usr/share/datasets/fashion-mnist"
    split: str = "train"
    class_names: tuple[str, ...] = ()

    def _open_source(self) -> ArraySource:
        if self.split not in IDX_SPLITS:
            raise UsageError(f"input '{self.name}': split must be train or test, got "
                             f"{self.split!r}")
        folder, stem = Path(self.folder), IDX_SPLITS[self.split]
        if not folder.is_dir():
            raise UsageError(f"input '{self.name}': {folder} is not a folder; give the folder "
                             f"of the MNIST-format IDX files")
        images_file = _idx_file(folder, f"{stem}-images-idx3-ubyte")
        labels_file = _idx_file(folder, f"{stem}-labels-idx1-ubyte")
        images = read_idx(images_file, IDX_IMAGES)
        labels = read_idx(labels_file, IDX_LABELS)
        if len(images) != len(labels):
            raise UsageError(f"{folder}: {images_file.name} holds {len(images)} images but "
                             f"{labels_file.name} {len(labels)} labels")
        return ArraySource(images[..., None], labels, self.class_names,
                           f"{images_file.resolve()}:{images_file.stat().st_size}")


@dataclasses.dataclass
class DigitsInput(ImageInput):
    """The UCI handwritten digits bundled in scikit-learn (``pax-vision[digits]``): 1,797
    8x8 images of 0-9, scaled from 0-16 to 0-255. ``split`` ``test`` is a fixed held-out set
    of ``HELD_OUT`` images (a seeded permutation's last), ``train`` the rest."""

    CHANNELS: ClassVar[int] = 1
    HELD_OUT: ClassVar[int] = 360

    split: str = "train"

    def _open_source(self) -> ArraySource:
        if self.split not in ("train", "test"):
            raise UsageError(f"input '{self.name}': split must be train or test, got "
                             f"{self.split!r}")
        try:
            from sklearn.datasets import load_digits
        except ImportError:
            raise UsageError(f"input '{self.name}': the digits come with scikit-learn; "
                             f"install it with pip install 'pax-vision[digits]'") from None
        digits = load_digits()
        images = np.round(digits.images * (255 / 16)).astype(np.uint8)[..., None]
        order = np.random.default_rng(0).permutation(len(images))
        mine = order[-self.HELD_OUT:] if self.split == "test" else order[:-self.HELD_OUT]
        return ArraySource(images[mine], digits.target[mine],
                           tuple(str(d) for d in range(10)), f"sklearn-digits:{self.split}")
