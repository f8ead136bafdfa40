"""Inputs of encoded images (JPEG, PNG, ...), decoded as they are read (in grain's worker
processes when ``num_workers`` > 0): a folder with a subfolder per class, and TFDS's
``imagenet2012`` as built by ``tfds build`` (``tf.train.Example`` records in ArrayRecord
files, read without TensorFlow)."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import numpy as np
from PIL import Image

from pax_core import UsageError, fingerprint, parse_tf_example, tfds_split_files
from pax_vision.inputs.base import BadImage, ImageInput

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff"})


def decode_image(data: bytes | Path, where: str, channels: int = 3) -> np.ndarray:
    """``uint8 [H, W, channels]`` (3: RGB, 1: grey) of an encoded image (a file or its bytes);
    ``BadImage`` if it is not one or is damaged (PIL's truncated-file error included)."""
    try:
        with Image.open(io.BytesIO(data) if isinstance(data, bytes) else data) as picture:
            pixels = np.asarray(picture.convert("L" if channels == 1 else "RGB"))
            return pixels.reshape(*pixels.shape[:2], channels)
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise BadImage(where, f"not a readable image ({type(e).__name__}: {e})") from None


class FolderSource:
    """``root/CLASS/FILE``: the classes are the subfolders in sorted order."""

    def __init__(self, root: Path):
        classes = sorted(p.name for p in root.iterdir() if p.is_dir()
                         and not p.name.startswith("."))
        if not classes:
            raise UsageError(f"{root}: no class subfolders; put each class's images in a "
                             f"subfolder named after it (root/CLASS/image.jpg)")
        self.files: list[str] = []
        labels = []
        for label, name in enumerate(classes):
            found = sorted(str(p) for p in (root / name).iterdir()
                           if p.suffix.lower() in IMAGE_SUFFIXES)
            self.files += found
            labels += [label] * len(found)
        if not self.files:
            raise UsageError(f"{root}: the class subfolders hold no images (files ending in "
                             f"{', '.join(sorted(IMAGE_SUFFIXES))})")
        self.labels = np.array(labels, np.int32)
        self.num_examples, self.num_classes = len(self.files), len(classes)
        self.class_names = tuple(classes)
        self.image_size = 0
        self.fingerprint = fingerprint(str(root.resolve()), classes, self.num_examples,
                                       self.files[0], self.files[-1])

    def example(self, index: int) -> tuple[np.ndarray, int]:
        return decode_image(Path(self.files[index]), self.files[index]), int(self.labels[index])


@dataclasses.dataclass
class ImageFolderInput(ImageInput):
    """Images in ``root/CLASS/`` subfolders (ImageNet's own layout); set ``image_size``."""

    root: str = ""

    def _open_source(self) -> FolderSource:
        root = Path(self.root)
        if not self.root or not root.is_dir():
            raise UsageError(f"input '{self.name}': root {self.root!r} is not a folder; give "
                             f"the folder of class subfolders")
        return FolderSource(root)


class TfdsSource:
    """The ``tf.train.Example`` records of one split: ``image`` (encoded bytes), ``label``."""

    def __init__(self, folder: Path, split: str, num_classes: int):
        import grain

        files = tfds_split_files(folder, split)
        if not files:
            raise UsageError(f"{folder}: no {split} split (no *-{split}.array_record-* files); "
                             f"give the folder tfds build wrote (imagenet2012/5.1.0)")
        self.records = grain.sources.ArrayRecordDataSource([str(f) for f in files])
        self.where = f"{folder} ({split})"
        names = folder / "label.labels.txt"  # TFDS's class names, one per line
        self.class_names = (tuple(names.read_text().split()) if names.is_file() else ())
        self.num_classes = len(self.class_names) or num_classes
        if not self.num_classes:
            raise UsageError(f"{folder}: no label.labels.txt naming the classes; set the "
                             f"input's num_classes")
        self.num_examples, self.image_size = len(self.records), 0
        self.fingerprint = fingerprint(str(folder.resolve()), split, self.num_examples)

    def example(self, index: int) -> tuple[np.ndarray, int]:
        where = f"{self.where} record {index}"
        features = parse_tf_example(self.records[index], where)
        if not features.get("image") or not features.get("label"):
            raise BadImage(where, "no image or label feature")
        return decode_image(features["image"][0], where), int(features["label"][0])


@dataclasses.dataclass
class TfdsImageInput(ImageInput):
    """A TFDS image-classification dataset built by ``tfds build`` (``imagenet2012``):
    ``folder`` is the version folder (``.../imagenet2012/5.1.0``), ``split`` ``train`` or
    ``validation``; set ``image_size``."""

    folder: str = ""
    split: str = "train"

    def _open_source(self) -> TfdsSource:
        folder = Path(self.folder)
        if not self.folder or not folder.is_dir():
            raise UsageError(f"input '{self.name}': folder {self.folder!r} is not a folder; "
                             f"give the TFDS dataset's version folder")
        return TfdsSource(folder, self.split, self.num_classes)
