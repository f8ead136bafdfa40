"""What happens to an image between its file and the batch: the training augmentation of the
ResNet papers (a random crop of 8%-100% of the area with aspect ratio 3/4-4/3, resized, flipped
left-right at random) and the evaluation transform (the shorter side resized to
``size / crop_fraction``, then the centre ``size`` x ``size``; 0.875 gives ImageNet's 256 -> 224).

Images are ``uint8 [H, W, C]`` numpy arrays; PIL resizes them (bilinear, on the crop box, so a
crop and its resize are one step).
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image


def _resize(image: np.ndarray, size: tuple[int, int],
            box: tuple[float, float, float, float] | None = None) -> np.ndarray:
    """``image`` (or its ``box``: left, top, right, bottom) resized to ``size`` (width, height)."""
    channels = image.shape[-1]
    picture = Image.fromarray(image[..., 0] if channels == 1 else image)
    out = np.asarray(picture.resize(size, Image.Resampling.BILINEAR, box=box))
    return out.reshape(size[1], size[0], channels)


def random_resized_crop(image: np.ndarray, size: int, rng: np.random.Generator,
                        scale: tuple[float, float] = (0.08, 1.0),
                        ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> np.ndarray:
    """A random crop of ``scale`` of the area and ``ratio`` width/height, resized to ``size``
    square; after ten misses, the centre crop of the whole image."""
    height, width = image.shape[:2]
    area = height * width
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            left = int(rng.integers(0, width - w + 1))
            top = int(rng.integers(0, height - h + 1))
            return _resize(image, (size, size), (left, top, left + w, top + h))
    side = min(height, width)
    left, top = (width - side) // 2, (height - side) // 2
    return _resize(image, (size, size), (left, top, left + side, top + side))


def centre_crop(image: np.ndarray, size: int, crop_fraction: float = 0.875) -> np.ndarray:
    """The evaluation view: an image already ``size`` square as it is; otherwise the shorter
    side resized to ``size / crop_fraction`` and the centre ``size`` square cut out."""
    height, width = image.shape[:2]
    if (height, width) == (size, size):
        return image
    # The centre square of side (shorter side * crop_fraction), resized to size in one step.
    side = min(height, width) * crop_fraction
    left, top = (width - side) / 2, (height - side) / 2
    return _resize(image, (size, size), (left, top, left + side, top + side))


def augment(image: np.ndarray, size: int, rng: np.random.Generator,
            scale: tuple[float, float], flip: bool) -> np.ndarray:
    """The training view: a random resized crop, then a left-right flip half the time."""
    out = random_resized_crop(image, size, rng, scale)
    if flip and rng.random() < 0.5:
        out = out[:, ::-1]
    return np.ascontiguousarray(out)
