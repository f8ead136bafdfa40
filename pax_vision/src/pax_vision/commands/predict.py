"""``pax predict``: the top classes of images by the latest checkpoint of a classifier job."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pax_core import JobRequest, UsageError, job_command, require_files


@job_command
def predict(
    job: JobRequest,
    images: Annotated[list[Path], typer.Argument(help="Image files (JPEG, PNG, ...).")],
    top: Annotated[int, typer.Option(help="How many classes to show per image.")] = 5,
) -> None:
    """Print the likeliest classes of each image, with their probabilities, by the latest
    checkpoint in --job-dir (or that of --restore-checkpoint-step). Images are brought to the
    model's size as evaluation does (the centre crop)."""
    import jax
    import numpy as np

    from pax_vision.inputs.base import BadImage
    from pax_vision.inputs.encoded import decode_image
    from pax_vision.inputs.transforms import centre_crop
    from pax_vision.models import ImageClassifier

    if top < 1:
        raise UsageError(f"--top must be >= 1, got {top}")
    require_files(images, "image")
    restored = job.restore(ImageClassifier, "an image classifier")
    model, data = restored.model, restored.run.train_input
    size = model.image_size or data.size()
    channels = model.channels or data.CHANNELS
    try:
        batch = np.stack([centre_crop(decode_image(p, str(p), channels), size) for p in images])
    except BadImage as bad:
        raise UsageError(f"cannot read {bad}") from None
    probabilities = np.asarray(jax.jit(lambda v, x: model.apply(v, x, method=model.predict))(
        restored.variables(), batch))
    names = model.class_names or getattr(data, "classes", tuple)()
    for path, row in zip(images, probabilities, strict=True):
        best = np.argsort(-row)[:top]
        restored.echo(f"{path}: " + ", ".join(
            f"{names[c] if c < len(names) else c} {row[c]:.3f}" for c in best))

