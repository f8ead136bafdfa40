"""Checksums of what each save wrote, verified before a restore.

Orbax commits a step atomically, but nothing checks the bytes afterwards: a flipped bit or a
truncated file in a committed step restores as silently damaged numbers. Once a step is
committed, process 0 records the size and CRC-32 of every file under it in
``STEP/pax_checksums.json`` (written atomically); a restore first compares them. A step without
the record (its process died between commit and record, or it was written before records
existed) cannot be verified: it counts as damaged when an earlier step has a record, so that a
run falls back to that one; only when no step has one is it restored unverified, relying on the
storage format's own checks. (Orbax commits a step by renaming its temporary folder, and offers no
public hook before the rename, so the record cannot be written ahead of the commit.) In a ``gs://``
job the files are objects, read back through the same path layer.
"""

from __future__ import annotations

import json
import os
import zlib
from typing import Any

from pax_core.files import job_path, walk_files, write_atomic

RECORD = "pax_checksums.json"
_CHUNK = 1 << 20


class DamagedCheckpoint(Exception):
    """A committed step whose files do not match what was written, or do not restore."""


class UnverifiedCheckpoint(DamagedCheckpoint):
    """A committed step without its checksum record while an earlier step has one: not known
    to be damaged, but not to be trusted over one that can be verified."""


def _size_and_crc32(path: Any) -> tuple[int, int]:
    size = crc = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            size, crc = size + len(chunk), zlib.crc32(chunk, crc)
    return size, crc


def _files(step_dir: Any) -> dict[str, Any]:
    """``{path relative to the step: path}`` of every file under it but the record."""
    return {name: path for name, path in walk_files(step_dir).items() if path.name != RECORD}


def record(step_dir: str | os.PathLike) -> None:
    """Write the checksums of every file of a committed step."""
    step_dir = job_path(step_dir)
    sums = {name: list(_size_and_crc32(path)) for name, path in _files(step_dir).items()}
    write_atomic(step_dir / RECORD, json.dumps(sums, sort_keys=True))


def has_record(step_dir: str | os.PathLike) -> bool:
    return (job_path(step_dir) / RECORD).exists()


def verify(step_dir: str | os.PathLike, earlier_verified: int | None = None) -> None:
    """Compare a step with its record; raises ``DamagedCheckpoint`` naming the first file that
    differs. A step without a record passes, unless its folder is empty or ``earlier_verified``
    names an earlier step that has one."""
    step_dir = job_path(step_dir)
    path = step_dir / RECORD
    if not path.exists():
        if step_dir.is_dir() and not any(step_dir.iterdir()):
            raise DamagedCheckpoint("its folder is empty")
        if earlier_verified is not None:
            raise UnverifiedCheckpoint(f"it has no checksum record ({RECORD}), and step "
                                       f"{earlier_verified} has: its run stopped, or is still "
                                       f"running, between the step's commit and the record")
        return
    try:
        expected = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DamagedCheckpoint(f"its checksum record {path} is unreadable ({e})") from None
    present = _files(step_dir)
    for name, (size, crc) in sorted(expected.items()):
        if name not in present:
            raise DamagedCheckpoint(f"{name} is missing")
        found_size, found_crc = _size_and_crc32(present[name])
        if found_size != size:
            raise DamagedCheckpoint(f"{name} has {found_size} bytes, {size} were written")
        if found_crc != crc:
            raise DamagedCheckpoint(f"{name} does not match its checksum")
