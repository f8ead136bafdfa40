"""The job directory's storage: local or ``gs://``, files replaced whole, and its failures told
in one line.

A ``gs://`` job directory goes through ``etils.epath`` (with gcsfs), the path layer Orbax itself
uses, while TensorStore writes the arrays with its own GCS driver; a local one is a
``pathlib.Path``. Both answer the same methods, so the code above this module does not ask
which it has, except where the two storages differ (``is_remote``): an object store has no
rename, append or lock, and an object appears whole once written.

A full disk, a read-only mount or a directory removed under a running job surface as an
``OSError`` from Python, or as a TensorStore error that carries the operating system's code in
its text (or only its status); ``storage_failure`` finds either in an exception's chain, so a
failure deep in a save thread is reported as what it is and what to do about it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pax_core.errors import UsageError

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


REMOTE = ("gs",)
# GCS's rule for bucket names (TensorStore refuses others, at the first save).
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]$")


CACHE_DIR_VAR = "PAX_CACHE_DIR"


def cache_dir() -> Path:
    """Pax's cache directory (a CPU's measured peak, compiled programs): ``PAX_CACHE_DIR``,
    else the user's cache directory."""
    import platformdirs  # imported here: every pax command imports this module, few need it

    return Path(os.environ.get(CACHE_DIR_VAR) or platformdirs.user_cache_dir("pax"))


def job_path(text: str | os.PathLike) -> Any:
    """A local path (absolute), or a ``gs://bucket/...`` one as an ``epath.Path``; any other
    ``scheme://`` is a ``UsageError`` (a local folder named ``s3:`` is never made)."""
    text = os.fspath(text)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return Path(text).expanduser().resolve()
    if scheme not in REMOTE:
        raise UsageError(f"{text}: {scheme}:// is not a storage Pax can keep a job in (Orbax "
                         f"writes checkpoints to local paths and gs://); use a gs:// or local "
                         f"path")
    bucket = rest.split("/", 1)[0]
    if not bucket:
        raise UsageError(f"{text} names no bucket; use gs://BUCKET/PATH")
    if not _BUCKET.match(bucket):
        raise UsageError(f"{text}: {bucket!r} is not a GCS bucket name (3 to 63 lowercase "
                         f"letters, digits, dots, dashes or underscores, starting and ending "
                         f"with a letter or digit)")
    try:
        import gcsfs  # noqa: F401  (epath's gs:// backend without TensorFlow)
        from etils import epath
    except ImportError:
        raise UsageError(f"{text}: gs:// job directories need gcsfs: pip install "
                         f"'pax-core[gcs]'") from None
    return epath.Path(text)


def is_remote(path: Any) -> bool:
    """Whether ``path`` is in an object store (``gs://``) rather than a file system."""
    return os.fspath(path).partition("://")[1] != ""


def write_atomic(path: Any, text: str) -> None:
    """Replace ``path`` with ``text`` in one step: readers (and a rerun after a crash) see the
    old content or the new, never a part. An object in a bucket is replaced whole by one
    upload; a file is written beside and renamed."""
    if is_remote(path):
        path.write_text(text)
        return
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


@contextlib.contextmanager
def held(path: Path, refusal: Callable[[str], UsageError]) -> Iterator[None]:
    """Hold the operating system's lock on ``path`` (``flock``, which a killed process
    releases, so it never has to be removed by hand), the holder's pid, host and start time
    inside; when another process holds it, raise ``refusal(that holder)``. A directory in
    its place (made by hand, or by a tool that copied the job) is a ``UsageError`` naming it.
    When the holder stops with a ``UsageError`` (which promises that nothing was changed), the
    lock file is put back as it was, its time included."""
    existed = path.exists()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory, where pax keeps a lock file; move it away "
                         f"or remove it, then run again (nothing was changed)") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "another process"
            raise refusal(holder) from None
        before, stat = os.read(fd, 4096), os.fstat(fd)
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, started "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        try:
            yield
        except UsageError:
            if not existed:
                path.unlink(missing_ok=True)
            else:
                os.ftruncate(fd, 0)
                os.pwrite(fd, before, 0)
                os.utime(fd, ns=(stat.st_atime_ns, stat.st_mtime_ns))
            raise
    finally:
        os.close(fd)  # closing releases the lock


def is_held(path: Path) -> bool:
    """Whether another process holds the lock on ``path`` (``held``); a directory in its place
    is no lock (``held`` refuses it)."""
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def read_text(path: Any) -> str:
    """A text file's content, undecodable bytes replaced (a damaged file is still read)."""
    return path.read_bytes().decode("utf-8", errors="replace")


def remove_tree(path: Any) -> None:
    """Remove a directory and all under it, as far as it goes."""
    if is_remote(path):
        with contextlib.suppress(OSError):
            path.rmtree(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def walk_files(root: Any) -> dict[str, Any]:
    """``{path relative to root: path}`` of every file under ``root`` (a bucket has no
    recursive glob, so this walks the listing)."""
    found, todo = {}, [root]
    while todo:
        for path in todo.pop().iterdir():
            if path.is_dir():
                todo.append(path)
            else:
                found[str(path.relative_to(root))] = path
    return found


def move(source: Any, target: Any) -> None:
    """Move a directory. A bucket has no rename (nor empty folders to rename into): each object
    is copied, then the source removed."""
    if not is_remote(source):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(source), str(target))
        return
    for name, path in walk_files(source).items():
        (target / name).write_bytes(path.read_bytes())
    remove_tree(source)


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
    failed = probe_write(job_path(directory)) if directory is not None else None
    code = getattr(failed, "errno", None)  # a bucket's own errors carry no system code
    return _told(errno.ENOENT if removed and code is None else code)


def _told(code: int | None) -> tuple[str, str] | None:
    """``(what failed, what to do)`` for a storage error code, None for any other."""
    return (os.strerror(code), REMEDIES[code]) if code in REMEDIES else None


def probe_write(directory: Any) -> Exception | None:
    """What writing (and removing) one small file in ``directory`` raises; None when it works."""
    probe = directory / f".pax-probe-{os.getpid()}"
    try:
        write_atomic(probe, "\0")
        probe.unlink()
    except Exception as e:
        return e
    return None
