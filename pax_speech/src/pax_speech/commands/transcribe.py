"""``pax transcribe``: transcripts of audio files by the latest checkpoint of a recognizer job."""

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

DECODERS = ("greedy", "beam")


def transcribe(
    ctx: typer.Context,
    job_dir: JobDirOpt,
    files: Annotated[list[Path], typer.Argument(help="Audio files (WAV, FLAC, ...).")],
    plugin: PluginOpt = None,
    exp: RecordedExpOpt = None,
    set_items: SetOpt = None,
    decoder: Annotated[str, typer.Option(help="greedy (best path) or beam (CTC prefix "
                                              "beam search).")] = "greedy",
    beam: Annotated[int, typer.Option(help="Prefixes kept per frame by --decoder beam.")] = 8,
    platform: PlatformOpt = None,
    restore_step: RestoreStepOpt = None,
) -> None:
    """Print the transcript of each audio file by the latest checkpoint in --job-dir (or that
    of --restore-checkpoint-step). Files of another sample rate are resampled to the model's,
    as training reads them."""
    import jax
    import numpy as np

    from pax_core import restore_latest
    from pax_speech import decoding
    from pax_speech.inputs.audio import BadAudio, read_audio
    from pax_speech.models import CtcRecognizer
    from pax_speech.vocab import CharVocabulary

    if decoder not in DECODERS:
        raise UsageError(f"--decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
    if beam < 1:
        raise UsageError(f"--beam must be >= 1, got {beam}")
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise UsageError(f"no such audio file: {', '.join(missing)}")
    run, state, step = restore_latest(ctx.obj, exp=exp, plugin=plugin, set_items=set_items or [],
                                      job_dir=job_dir, platform=platform, step=restore_step)
    model = run.task.model
    if not isinstance(model, CtcRecognizer):
        raise UsageError(f"experiment {run.resolved.name} is not a speech recognizer")
    try:
        waves = [read_audio(str(p), model.features.sample_rate) for p in files]
    except BadAudio as bad:
        raise UsageError(f"cannot read {bad}") from None
    audio = np.zeros((len(waves), max(len(w) for w in waves)), np.float32)
    for row, wave in zip(audio, waves, strict=True):
        row[: len(wave)] = wave
    lengths = np.asarray([len(w) for w in waves], np.int32)
    def recognise(variables, audio, lengths):
        log_probs, frames = model.apply(variables, audio, lengths, method=model.transcribe)
        return log_probs, frames, decoding.greedy_decode(log_probs, frames)

    log_probs, frames, (best, best_lengths) = jax.device_get(jax.jit(recognise)(
        run.eval_variables(state), audio, lengths))
    vocabulary = CharVocabulary(model.alphabet)
    if jax.process_index() != 0:
        return
    for i, path in enumerate(files):
        ids = (decoding.prefix_beam_search(log_probs[i, : int(frames[i])], beam)
               if decoder == "beam" else best[i, : int(best_lengths[i])])
        typer.echo(f"[step {step}] {path}: {vocabulary.decode(ids)}")


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
app.command()(transcribe)
