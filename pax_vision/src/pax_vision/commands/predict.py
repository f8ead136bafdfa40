"""``pax predict``: the top classes of images by the latest checkpoint of a classifier job."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pax_core import (
    JobDirOpt,
    PlatformOpt,
    PluginOpt,
    RecordedExpOpt,
    RestoreStepOpt,
    SetOpt,
    UsageError,
)


def predict(
    ctx: typer.Context,
    job_dir: JobDirOpt,
    images: Annotated[list[Path], typer.Argument(help="Image files (JPEG, PNG, ...).")],
    plugin: PluginOpt = None,
    exp: RecordedExpOpt = None,
    set_items: SetOpt = None,
    top: Annotated[int, typer.Option(help="How many classes to show per image.")] = 5,
    platform: PlatformOpt = None,
    restore_step: RestoreStepOpt = None,
) -> None:
    """Print the likeliest classes of each image, with their probabilities, by the latest
    checkpoint in --job-dir (or that of --restore-checkpoint-step). Images are brought to the
    model's size as evaluation does (the centre crop)."""
    import jax
    import numpy as np

    from pax_core import restore_latest
    from pax_vision.inputs.base import BadImage
    from pax_vision.inputs.encoded import decode_image
    from pax_vision.inputs.transforms import centre_crop
    from pax_vision.models import ImageClassifier

    if top < 1:
        raise UsageError(f"--top must be >= 1, got {top}")
    missing = [str(p) for p in images if not p.is_file()]
    if missing:
        raise UsageError(f"no such image file: {', '.join(missing)}")
    run, state, step = restore_latest(ctx.obj, exp=exp, plugin=plugin, set_items=set_items or [],
                                      job_dir=job_dir, platform=platform, step=restore_step)
    model = run.task.model
    if not isinstance(model, ImageClassifier):
        raise UsageError(f"experiment {run.resolved.name} is not an image classifier")
    size = model.image_size or run.train_input.size()
    channels = model.channels or run.train_input.CHANNELS
    try:
        batch = np.stack([centre_crop(decode_image(p, str(p), channels), size) for p in images])
    except BadImage as bad:
        raise UsageError(f"cannot read {bad}") from None
    probabilities = np.asarray(jax.jit(lambda v, x: model.apply(v, x, method=model.predict))(
        run.eval_variables(state), batch))
    names = model.class_names or getattr(run.train_input, "classes", tuple)()
    if jax.process_index() != 0:
        return
    for path, row in zip(images, probabilities, strict=True):
        best = np.argsort(-row)[:top]
        shown = ", ".join(f"{names[c] if c < len(names) else c} {row[c]:.3f}" for c in best)
        typer.echo(f"[step {step}] {path}: {shown}")


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
app.command()(predict)
