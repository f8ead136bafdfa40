"""Giving the host memory that compiling freed back to the system before training starts.

XLA compiles a step in a few hundred MiB of C heap and frees it when done, but glibc's
allocator keeps freed pages mapped for reuse: the process stays that much larger, and every
step's temporaries then land on top. So the resident peak of a short run on a small model is
the compiler's high-water mark plus a step's working set, not what training needs. glibc's
``malloc_trim`` returns every whole free page of its heaps to the system; the next
allocations map fresh pages as they would anyway.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any


@functools.cache
def _libc() -> Any:
    """The C library this process runs on, where it has ``malloc_trim`` (glibc; not musl, not
    macOS)."""
    libc = ctypes.CDLL(None)  # the symbols already loaded, the C library's among them
    return libc if hasattr(libc, "malloc_trim") else None


def release_freed_memory() -> bool:
    """Return the C heap's free pages to the system; whether this platform can (glibc)."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True
