"""Weight formats: the homes of a model's weights outside Pax (Hugging Face's folders, paxml's
checkpoints), which ``pax import FORMAT`` reads into a job and ``pax export --format FORMAT``
writes from one.

The core owns job directories and checkpoints; a format owns only the mapping between its
files and a Pax model's parameters. So a format answers three questions and writes nothing into
a job itself: which experiment (and which ``--set`` overrides) rebuilds the source's model
(``inspect``), what the source's weights are, one tensor at a time (``read``), and how a job's
parameters are written in its layout (``write``). The importer checks every tensor against the
model's parameters as it passes to the checkpointer, which writes a weights-only step 0 as the
tensors arrive (``Checkpointer.save_weights``: the host holds a few tensors at a time, not the
model), and ``pax train`` continues from it with a fresh optimizer state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

ParamPath = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class SourceModel:
    """What a format read of a source's model, before any weight: the experiment and overrides
    that rebuild it in Pax, the files a job carries along (``files``: a name under
    ``JOB_DIR/assets/`` -> the source file, such as a tokenizer, which the overrides may name
    at its new place), and one line saying what it is."""

    experiment: str
    overrides: list[str]
    description: str
    files: dict[str, Path] = dataclasses.field(default_factory=dict)


class WeightFormat:
    """One foreign layout of a model's weights. Implementations raise ``UsageError`` (one line,
    naming what is wrong and what to do) for anything the format cannot express or the source
    lacks, before anything is written."""

    reads: ClassVar[bool] = True  # whether ``pax import`` reads it (``inspect``, ``read``)
    writes: ClassVar[bool] = True  # whether ``pax export --format`` writes it (``write``)

    def inspect(self, source: Path, assets: Path, exp: str | None, set_items: list[str]
                ) -> SourceModel:
        """Read what ``source`` says of its model (its configuration, not its weights).
        ``assets`` is where the job's carried files will be (``JOB_DIR/assets``); ``exp`` and
        ``set_items`` are the user's (a format whose files do not say which model they hold
        requires ``exp``). Only a format with ``reads`` True defines it, and ``read``."""
        raise NotImplementedError(f"{type(self).__name__} is written by pax export only")

    def recognises(self, source: Path) -> bool:
        """Whether ``source`` is a folder of this format (``task.train.init_from`` asks each
        format in turn); a format that cannot tell says no."""
        return False

    def read(self, source: Path, model: Any) -> Iterator[tuple[ParamPath, np.ndarray]]:
        """The source's weights as ``(path, array)`` pairs, one tensor at a time, for the
        job's ``model`` object: ``path`` is a key path into the model's parameters (the format
        knows the model's layout: a scanned stack's weights come stacked). The importer checks
        each array's shape and dtype and that every parameter comes exactly once."""
        raise NotImplementedError(f"{type(self).__name__} is written by pax export only")

    def write(self, output: Path, model: Any, params: Callable[[ParamPath], np.ndarray],
              datasets: list[Any]) -> None:
        """Write a job's parameters into the new, empty folder ``output``: ``model`` is the
        job's model object; ``params`` fetches one parameter from the devices by its key path
        (float32, as trained), so that a format holds one at a time;
        ``datasets`` are the job's inputs (a tokenizer to carry along, say). Only a format
        with ``writes`` True defines it (``pax export`` asks that first)."""
        raise NotImplementedError(f"{type(self).__name__} is read by pax import only")


def key_paths(tree: Any) -> dict[ParamPath, Any]:
    """Each leaf of a parameter tree by its key path (``("decoder", "embedding",
    "embedding")``), in the tree's order: the paths formats, imports, exports and warm starts
    name parameters by."""
    import jax

    return {tuple(str(getattr(k, "key", k)) for k in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}
