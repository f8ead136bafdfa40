"""Freed C heap goes back to the system before training (``pax_core.run.host_memory``)."""

import json
import subprocess
import sys
import textwrap

import pytest

from pax_core.run.host_memory import release_freed_memory

# In a fresh process: 256 MiB of small blocks, all freed but the last (which pins the top of
# the heap, so that free() itself cannot shrink it), then the resident size before and after.
SCRIPT = textwrap.dedent("""\
    import ctypes, ctypes.util, json
    from pax_core.run.host_memory import release_freed_memory
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    def resident_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * 4096 / 2**20
    blocks = [libc.malloc(4096) for _ in range(65536)]
    for b in blocks:
        ctypes.memset(b, 1, 4096)
    for b in blocks[:-1]:
        libc.free(b)
    before = resident_mib()
    released = release_freed_memory()
    print(json.dumps({"released": released, "before": before, "after": resident_mib()}))
    """)


@pytest.mark.skipif(not release_freed_memory(), reason="glibc's malloc_trim is not here")
def test_freed_heap_pages_go_back_to_the_system():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          check=True, timeout=120)
    sizes = json.loads(done.stdout)
    assert sizes["released"]
    assert sizes["before"] - sizes["after"] > 200, sizes  # of the 256 MiB freed
