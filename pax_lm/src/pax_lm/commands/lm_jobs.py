"""What the commands over a trained language-model job share (``pax decode``, ``pax score``):
restoring the job's decoder with its tokenizer, and writing a JSONL output whole.

An output is written beside its destination as ``OUTPUT.partial`` and renamed into place once
complete, so a failed or interrupted command leaves nothing; an existing output is replaced only
with ``--overwrite``, and an ``OUTPUT.partial`` already there may be another run's, so it is
refused.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from pax_core import JobRequest, UsageError


def restore_lm(job: JobRequest, quantize: str = "none") -> tuple[Any, Any, Any, dict[str, Any]]:
    """The restored job, its tokenizer, decoder and the decoder's variables (its ``params``
    and any other collection it reads), the decoder quantized as ``quantize`` says
    (``pax_lm.quantization.MODES``); a job that is no text language model is refused. The
    job's state is let go: the variables hold all that running the decoder needs. A job
    trained in int8 (``QUANTIZE_TRAINING``) runs its plain decoder: its weights are float."""
    from pax_lm.models import LanguageModel
    from pax_lm.quantization import quantize as quantized
    from pax_lm.quantized_training import plain

    restored = job.restore(LanguageModel, "a language model")
    tokenizer = getattr(restored.run.train_input, "tokenizer", None)
    if tokenizer is None:
        raise UsageError(f"experiment {restored.run.resolved.name} is not a text language "
                         f"model (its input has no tokenizer)")
    variables = {name: collection["decoder"] for name, collection
                 in restored.variables().items() if "decoder" in collection}
    restored.state = None
    decoder, variables = quantized(plain(restored.model.decoder), variables, quantize)
    return restored, tokenizer, decoder, variables


def check_output(output: Path, overwrite: bool) -> None:
    """Refuse an --output that cannot be written, or would replace a file unasked."""
    if "://" in str(output):
        raise UsageError(f"--output {output}: results are written to a local file")
    if not output.parent.is_dir():
        raise UsageError(f"--output {output}: no such folder {output.parent}")
    if output.is_dir():
        raise UsageError(f"--output {output} is a folder; name a file")
    if output.exists() and not overwrite:
        raise UsageError(f"--output {output} exists; pass --overwrite to replace it, or name "
                         f"another file")
    partial = _partial(output)
    if partial.exists():
        raise UsageError(f"{partial} exists: another pax command may be writing {output}; if "
                         f"none is, remove {partial} and run again")


def _partial(output: Path) -> Path:
    return output.with_name(output.name + ".partial")


@contextlib.contextmanager
def written_whole(output: Path, primary: bool) -> Iterator[IO[str] | None]:
    """A file to write ``output`` through (None on a process that does not write): it is
    ``OUTPUT.partial`` until the block ends well, then renamed into place; removed if not."""
    if not primary:
        yield None
        return
    partial = _partial(output)
    try:
        with open(partial, "x", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, output)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise
