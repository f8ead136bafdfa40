"""JAX's persistent compilation cache, on by default: a rerun or a resume of the same experiment
loads its compiled programs from disk instead of compiling them again.

Where: ``PAX_COMPILATION_CACHE`` (a folder, or ``off``), else ``xla/`` in Pax's cache directory
(``PAX_CACHE_DIR``, else the user's cache directory). Inside it each jax and jaxlib version has
a folder of its own, so programs compiled by one XLA are never offered to another (JAX's own
keys hold the compiler's version too; the folders also make an old version's entries easy to
delete). A ``JAX_COMPILATION_CACHE_DIR`` the user set is theirs and is kept. The cache keeps
the most recently used ``MAX_BYTES``.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import jaxlib
from jax.experimental.compilation_cache import compilation_cache

from pax_core.files import cache_dir

CACHE_VAR = "PAX_COMPILATION_CACHE"
MAX_BYTES = 4 * 2**30
# Programs that compile faster than this are not worth a file (JAX's default is 1 s, which
# leaves out a small model's train step on a CPU).
MIN_COMPILE_SEC = 0.2


def cache_folder() -> Path | None:
    """Where compiled programs go for this jax and jaxlib; None when the cache is off."""
    setting = os.environ.get(CACHE_VAR, "").strip()
    if setting.lower() == "off":
        return None
    root = Path(setting).expanduser() if setting else cache_dir() / "xla"
    return root / f"jax-{jax.__version__}-jaxlib-{jaxlib.__version__}"


def use_compilation_cache() -> str:
    """Point JAX's persistent cache at ``cache_folder()`` before anything compiles; returns
    what the start record says of it: the folder, ``off``, or the user's folder."""
    users = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if users:
        return f"{users} (JAX_COMPILATION_CACHE_DIR, yours)"
    folder = cache_folder()
    wanted = None if folder is None else str(folder)
    if jax.config.jax_compilation_cache_dir != wanted:
        # An earlier run in this process may have used another folder (or none): JAX opens
        # its cache once, so it is reset to open the one wanted now.
        compilation_cache.reset_cache()
        jax.config.update("jax_compilation_cache_dir", wanted)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SEC)
        jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return wanted or "off"
