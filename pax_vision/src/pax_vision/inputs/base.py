"""What pax-vision's inputs share: batches of labelled images from an ``ImageSource``, on the
core's ``IndexedInput``.

The example stream is the source's examples in a seeded order (a new permutation every epoch),
and global batch ``k`` is stream positions ``[k * batch_size, (k + 1) * batch_size)``: process
``p`` decodes only its rows of it. The position saved in checkpoints is the number of batches
read, so a resume continues on the exact next batch, also with another number of processes or
workers (``IndexedInput``).

Augmentation draws from a generator seeded by (seed, batch, row) alone, so it too is the same
whatever the process and worker counts. A finite input (evaluation) reads the source once in
order and pads its last batch with weight-0 rows, so every image counts once.

An image that cannot be decoded is, by ``on_bad_image``, ``"skip"``-ped (its row gets weight
0 and a warning names the file and counts the skipped ones) or ``"stop"``-s the run with a
line naming the file. ``check()`` decodes this process's first batch before anything is
written, so a bad source fails there.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Protocol

import grain
import jax
import numpy as np

from pax_core import IndexedInput, UsageError, fingerprint, warn
from pax_vision.inputs import transforms

_SKIPPED = "_skipped"  # the files of the batch's undecodable images
ON_BAD_IMAGE = ("skip", "stop")


class BadImage(Exception):
    """An example whose image cannot be decoded; ``where`` names it (a file, a record)."""

    def __init__(self, where: str, reason: str):
        super().__init__(f"{where}: {reason}")
        self.where, self.reason = where, reason


class ImageSource(Protocol):
    """Labelled images by number: what an input reads of its data."""

    num_examples: int
    num_classes: int
    class_names: tuple[str, ...]  # () when the data names none
    image_size: int  # the side of every (square) image; 0 when sizes differ
    fingerprint: str  # changes when the examples do

    def example(self, index: int) -> tuple[np.ndarray, int]:
        """Image ``index`` as ``uint8 [H, W, C]`` and its label; raises ``BadImage``."""


@dataclasses.dataclass
class ImageInput(IndexedInput):
    """Batches ``image`` (``uint8 [local batch, size, size, channels]``), ``label`` (int32) and
    ``weight`` (float32, 0 on padding and skipped images).

    ``image_size``: the side images are brought to (0: the source's own, for sources of one
    size). ``num_classes``: the model's (0: the source's); a source with another count is
    refused. ``augment`` (training): random resized crops of ``crop_scale`` of the area,
    flipped when ``flip``; otherwise the centre crop of ``crop_fraction``.
    """

    CHANNELS: ClassVar[int] = 3
    CHANGED: ClassVar[str] = "the images, seed, batch_size, shuffle or repeat"

    image_size: int = 0
    num_classes: int = 0
    augment: bool = False
    crop_scale: tuple[float, float] = (0.08, 1.0)
    flip: bool = True
    crop_fraction: float = 0.875
    on_bad_image: str = "skip"

    def __post_init__(self):
        super().__post_init__()
        where = f"input '{self.name}'"
        if self.image_size < 0:
            raise UsageError(f"{where}: image_size must be >= 0, got {self.image_size}")
        if self.on_bad_image not in ON_BAD_IMAGE:
            raise UsageError(f"{where}: on_bad_image must be one of {', '.join(ON_BAD_IMAGE)}, "
                             f"got {self.on_bad_image!r}")
        if not 0 < self.crop_fraction <= 1:
            raise UsageError(f"{where}: crop_fraction must be in (0, 1], got "
                             f"{self.crop_fraction}")
        self._opened: ImageSource | None = None
        self._skipped = 0

    # What a subclass provides.

    def _open_source(self) -> ImageSource:
        """The data, opened and checked (``UsageError`` for anything wrong with it)."""
        raise NotImplementedError

    # The source and its checks.

    def source(self) -> ImageSource:
        """The data, opened on first use (building a config reads nothing)."""
        if self._opened is None:
            self._opened = self._open_source()
        return self._opened

    def size(self) -> int:
        """The side of the batch's images."""
        return self.image_size or self.source().image_size

    def classes(self) -> tuple[str, ...]:
        """The class names of the data (``()`` when it names none)."""
        return self.source().class_names

    def check(self) -> None:
        source, where = self.source(), f"input '{self.name}'"
        if self.num_classes and source.num_classes != self.num_classes:
            raise UsageError(f"{where}: the data has {source.num_classes} classes but the model "
                             f"has {self.num_classes}; set the experiment's NUM_CLASSES to "
                             f"{source.num_classes}, or use data of {self.num_classes} classes")
        if not self.size():
            raise UsageError(f"{where}: the images are of different sizes; set image_size to "
                             f"the side the model takes")
        self.peek()  # decodes this process's first batch: a bad file fails here

    def abstract_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
        b = self.local_batch_size
        return {"image": jax.ShapeDtypeStruct((b, self.size(), self.size(), self.CHANNELS),
                                              np.uint8),
                "label": jax.ShapeDtypeStruct((b,), np.int32),
                "weight": jax.ShapeDtypeStruct((b,), np.float32)}

    # The stream (IndexedInput).

    def data_key(self) -> str:
        return fingerprint(self.seed, self.shuffles, self.repeats, self.batch_size,
                           self.source().fingerprint)

    def num_batches(self) -> int:
        return self.finite_batches(self.source().num_examples)

    def batch_reader(self) -> LoadBatch:
        return LoadBatch(self.source(), self.example_order(self.source().num_examples), self)

    def received(self, batch: dict[str, Any], peeking: bool) -> dict[str, np.ndarray]:
        skipped = batch.pop(_SKIPPED)
        for where in [] if peeking else skipped:
            self._skipped += 1
            warn(f"input '{self.name}': skipped {where} ({self._skipped} unreadable images "
                 f"so far)")
        return batch


class LoadBatch:
    """Global batch ``k`` -> this process's rows of it, decoded and transformed (a class, so
    that grain's worker processes unpickle it)."""

    def __init__(self, source: ImageSource, order: grain.MapDataset, spec: ImageInput):
        self.source, self.order = source, order
        rows = spec.process_rows()
        self.rows = range(rows.start, rows.stop)
        self.batch_size, self.seed, self.size = spec.batch_size, spec.seed, spec.size()
        self.channels = spec.CHANNELS
        self.augment = spec.augment and spec.is_training
        self.crop_scale, self.flip = tuple(spec.crop_scale), spec.flip
        self.crop_fraction, self.stop = spec.crop_fraction, spec.on_bad_image == "stop"
        self.name = spec.name

    def __call__(self, k: int) -> dict[str, np.ndarray]:
        n = len(self.rows)
        images = np.zeros((n, self.size, self.size, self.channels), np.uint8)
        labels = np.zeros(n, np.int32)
        weights = np.zeros(n, np.float32)
        skipped = []
        for i, row in enumerate(self.rows):
            position = k * self.batch_size + row
            if position >= len(self.order):
                continue  # padding of a finite input's last batch
            try:
                image, label = self.source.example(self.order[position])
            except BadImage as bad:
                if self.stop:
                    raise UsageError(f"input '{self.name}': cannot read {bad} (set the "
                                     f"input's on_bad_image='skip' to leave such images "
                                     f"out)") from None
                skipped.append(bad.where)
                continue
            images[i] = self._view(image, k, row)
            labels[i], weights[i] = label, 1.0
        return {"image": images, "label": labels, "weight": weights, _SKIPPED: skipped}

    def _view(self, image: np.ndarray, k: int, row: int) -> np.ndarray:
        if self.augment:
            rng = np.random.default_rng([self.seed, k, row])
            return transforms.augment(image, self.size, rng, self.crop_scale, self.flip)
        return transforms.centre_crop(image, self.size, self.crop_fraction)
