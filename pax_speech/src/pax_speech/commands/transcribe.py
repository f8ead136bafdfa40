"""``pax transcribe``: transcripts of audio files by the latest checkpoint of a recognizer job."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pax_core import JobRequest, UsageError, job_command, require_files

DECODERS = ("greedy", "beam")


@job_command
def transcribe(
    job: JobRequest,
    files: Annotated[list[Path], typer.Argument(help="Audio files (WAV, FLAC, ...).")],
    decoder: Annotated[str, typer.Option(help="greedy (best path) or beam (CTC prefix "
                                              "beam search).")] = "greedy",
    beam: Annotated[int, typer.Option(help="Prefixes kept per frame by --decoder beam.")] = 8,
) -> None:
    """Print the transcript of each audio file by the latest checkpoint in --job-dir (or that
    of --restore-checkpoint-step). Files of another sample rate are resampled to the model's,
    as training reads them."""
    import jax
    import numpy as np

    from pax_speech import decoding
    from pax_speech.inputs.audio import BadAudio, read_audio
    from pax_speech.models import CtcRecognizer
    from pax_speech.vocab import CharVocabulary

    if decoder not in DECODERS:
        raise UsageError(f"--decoder must be one of {', '.join(DECODERS)}, got {decoder!r}")
    if beam < 1:
        raise UsageError(f"--beam must be >= 1, got {beam}")
    require_files(files, "audio")
    restored = job.restore(CtcRecognizer, "a speech recognizer")
    model = restored.model
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
        restored.variables(), audio, lengths))
    vocabulary = CharVocabulary(model.alphabet)
    for i, path in enumerate(files):
        ids = (decoding.prefix_beam_search(log_probs[i, : int(frames[i])], beam)
               if decoder == "beam" else best[i, : int(best_lengths[i])])
        restored.echo(f"{path}: {vocabulary.decode(ids)}")

