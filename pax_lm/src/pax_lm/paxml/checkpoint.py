"""paxml's checkpoints on disk: which step folder a path means, and its arrays, one at a time.

paxml's SPMD trainer (``--checkpoint_type=gda``, its default) writes
``JOB/checkpoints/checkpoint_<8-digit step>/state/``, one zarr array per leaf of its train
state, each a folder named by the leaf's dotted path (``mdl_vars.params.lm.final_ln.scale``,
``opt_states_0_2.m.params...``) holding ``.zarray`` and its zstd-compressed chunks. A step is
complete once renamed into place (orbax writes it under a temporary name first). The arrays
read through tensorstore's zarr driver, which orbax itself uses, without paxml installed.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from pax_core import UsageError

STEP_FOLDER = re.compile(r"checkpoint_(\d+)")
WEIGHTS = "mdl_vars.params."  # the model's trainable weights; opt_states and step are not read


def state_folder(source: Path) -> tuple[Path, int | None]:
    """The ``state`` folder of the step ``source`` names, and that step: ``source`` is a step
    folder, its ``state`` folder, a ``checkpoints`` folder or a paxml job directory (their
    newest complete step)."""
    folder = source
    for steps in (source / "checkpoints", source):
        found = sorted((int(m.group(1)), p) for p in _children(steps)
                       if (m := STEP_FOLDER.fullmatch(p.name)) and (p / "state").is_dir())
        if found:
            folder = found[-1][1]
            break
    if (folder / "state").is_dir():
        folder = folder / "state"
    match = STEP_FOLDER.fullmatch(folder.parent.name)
    if (folder / "manifest.ocdbt").exists():
        raise UsageError(f"{folder} was written with --tensorstore_use_ocdbt; Pax reads paxml's "
                         f"default layout (a zarr folder an array): restore it with paxml and "
                         f"save it again without OCDBT")
    if not _arrays(folder):
        raise UsageError(f"{source} holds no paxml checkpoint (a checkpoints/checkpoint_<step>/"
                         f"state folder of zarr arrays); give a paxml job directory or one of "
                         f"its checkpoint folders")
    return folder, int(match.group(1)) if match else None


def weight_names(state: Path) -> dict[str, tuple[int, ...]]:
    """The model's weights in a ``state`` folder: dotted name after ``mdl_vars.params.`` ->
    shape, from each array's ``.zarray``."""
    shapes = {}
    for folder in _arrays(state):
        if folder.name.startswith(WEIGHTS):
            try:
                shape = json.loads((folder / ".zarray").read_text())["shape"]
            except (OSError, ValueError, KeyError) as e:
                raise UsageError(f"{folder}/.zarray does not read ({e}); the checkpoint is "
                                 f"damaged") from None
            shapes[folder.name[len(WEIGHTS):]] = tuple(shape)
    return shapes


def read_array(state: Path, name: str) -> np.ndarray:
    """The weight ``name`` (as ``weight_names`` gives it), float32."""
    import tensorstore as ts

    path = (state / (WEIGHTS + name)).resolve()
    try:
        array = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": str(path)}},
                        open=True).result()
        values = array.read().result()
    except (ValueError, OSError) as e:
        raise UsageError(f"{path} does not read as a zarr array ({e}); the checkpoint is "
                         f"damaged") from None
    return np.asarray(values, np.float32)


def _children(folder: Path) -> list[Path]:
    return list(folder.iterdir()) if folder.is_dir() else []


def _arrays(folder: Path) -> list[Path]:
    return sorted(p for p in _children(folder) if (p / ".zarray").is_file())
