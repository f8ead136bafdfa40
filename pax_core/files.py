"""The job directory's storage: files replaced whole, and its failures told in one line.

A full disk, a read-only mount or a directory removed under a running job surface as an
``OSError`` from Python, or as a TensorStore error that carries the operating system's code in
its text (or only its status); ``storage_failure`` finds either in an exception's chain, so a
failure deep in a save thread is reported as what it is and what to do about it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from pathlib import Path

# What a user does about each failure the storage can have.
REMEDIES = {
    errno.ENOSPC: "free space there",
    errno.EDQUOT: "free space there (the disk quota is used up)",
    errno.EROFS: "make it writable",
    errno.EACCES: "make it writable",
    errno.EPERM: "make it writable",
    errno.ENOENT: "put it back (it was removed while the run was writing to it)",
    errno.EIO: "check the disk",
}
_CODE = re.compile(r"\[Errno (\d+)\]|os_error_code='(\d+)'")
# TensorStore's status for a file it could not write, when it gives no system code.
_STATUS = re.compile(r"\b(NOT_FOUND|PERMISSION_DENIED|RESOURCE_EXHAUSTED): .*\bfile\b")
_STATUS_CODES = {"NOT_FOUND": errno.ENOENT, "PERMISSION_DENIED": errno.EACCES,
                 "RESOURCE_EXHAUSTED": errno.ENOSPC}


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` in one step: readers (and a rerun after a crash) see the
    old content or the new, never a part."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _chain(error: BaseException):
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def storage_failure(error: BaseException, directory: str | os.PathLike | None = None,
                    removed: bool = False) -> tuple[str, str] | None:
    """``(what failed, what to do)`` when ``error`` comes from the storage, else None.

    The storage's code is looked for in the chain of ``error``; a library that reports the
    failure in its own words (Orbax, when its directory vanished under a save) gives none, so
    then ``directory`` is probed by writing a byte to it, and a directory the caller knows was
    ``removed`` (and perhaps made again) is that cause."""
    for link in _chain(error):
        code = link.errno if isinstance(link, OSError) else None
        if code not in REMEDIES:
            found = _CODE.search(str(link))
            code = int(found.group(1) or found.group(2)) if found else None
        if code not in REMEDIES:
            found = _STATUS.search(str(link))
            code = _STATUS_CODES[found.group(1)] if found else None
        if code in REMEDIES:
            return _told(code)
    code = _probe(Path(directory)) if directory is not None else None
    return _told(errno.ENOENT if removed and code is None else code)


def _told(code: int | None) -> tuple[str, str] | None:
    """``(what failed, what to do)`` for a storage error code, None for any other."""
    return (os.strerror(code), REMEDIES[code]) if code in REMEDIES else None


def _probe(directory: Path) -> int | None:
    """The error code of writing one byte into ``directory``, or None when that works."""
    probe = directory / f".pax-probe-{os.getpid()}"
    try:
        write_atomic(probe, "\0")
        probe.unlink()
    except OSError as e:
        return e.errno
    return None
