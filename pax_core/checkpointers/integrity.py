"""Checksums of what each save wrote, verified before a restore.

Orbax commits a step atomically, but nothing checks the bytes afterwards: a flipped bit or a
truncated file in a committed step restores as silently damaged numbers. Once a step is
committed, process 0 records the size and CRC-32 of every file under it in
``STEP/pax_checksums.json`` (written atomically); a restore first compares them. A step without
the record (written before it existed, or whose process died between commit and record) is
restored unverified and relies on the storage format's own checks.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

from pax_core.files import write_atomic

RECORD = "pax_checksums.json"
_CHUNK = 1 << 20


class DamagedCheckpoint(Exception):
    """A committed step whose files do not match what was written, or do not restore."""


def _crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _files(step_dir: Path) -> list[Path]:
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and p.name != RECORD)


def record(step_dir: str | os.PathLike) -> None:
    """Write the checksums of every file of a committed step."""
    step_dir = Path(step_dir)
    sums = {str(p.relative_to(step_dir)): [p.stat().st_size, _crc32(p)] for p in
            _files(step_dir)}
    write_atomic(step_dir / RECORD, json.dumps(sums, sort_keys=True))


def verify(step_dir: str | os.PathLike) -> None:
    """Compare a step with its record (a step without one passes); raises
    ``DamagedCheckpoint`` naming the first file that differs."""
    step_dir = Path(step_dir)
    path = step_dir / RECORD
    if not path.exists():
        return
    try:
        expected = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise DamagedCheckpoint(f"its checksum record {path} is unreadable ({e})") from None
    present = {str(p.relative_to(step_dir)) for p in _files(step_dir)}
    for name, (size, crc) in sorted(expected.items()):
        file = step_dir / name
        if name not in present:
            raise DamagedCheckpoint(f"{name} is missing")
        if file.stat().st_size != size:
            raise DamagedCheckpoint(f"{name} has {file.stat().st_size} bytes, {size} were "
                                    f"written")
        if _crc32(file) != crc:
            raise DamagedCheckpoint(f"{name} does not match its checksum")
