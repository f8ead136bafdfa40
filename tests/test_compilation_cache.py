"""The persistent compilation cache: on by default in Pax's cache directory, one folder per jax
and jaxlib version, moved or turned off by PAX_COMPILATION_CACHE, the user's own JAX setting
kept; a rerun reads its compiled train step instead of compiling it."""

from __future__ import annotations

from pathlib import Path

import jax
import jaxlib

from pax_core.run.compilation_cache import cache_folder, use_compilation_cache
from pax_core.testing import read_metrics, run_pax

VERSIONS = f"jax-{jax.__version__}-jaxlib-{jaxlib.__version__}"


def test_the_folder_is_per_version_and_follows_the_settings(monkeypatch, tmp_path):
    monkeypatch.delenv("PAX_COMPILATION_CACHE", raising=False)
    monkeypatch.setenv("PAX_CACHE_DIR", str(tmp_path / "pax"))
    assert cache_folder() == tmp_path / "pax" / "xla" / VERSIONS
    monkeypatch.setenv("PAX_COMPILATION_CACHE", str(tmp_path / "mine"))
    assert cache_folder() == tmp_path / "mine" / VERSIONS
    monkeypatch.setenv("PAX_COMPILATION_CACHE", "off")
    assert cache_folder() is None


def test_a_jax_cache_of_the_users_is_kept(monkeypatch):
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/somewhere/theirs")
    before = jax.config.jax_compilation_cache_dir
    assert use_compilation_cache() == "/somewhere/theirs (JAX_COMPILATION_CACHE_DIR, yours)"
    assert jax.config.jax_compilation_cache_dir == before


def _train(job_dir: Path) -> dict:
    result = run_pax("train", "--plugin", "lm", "--exp", "TinyLmForTests", "--job-dir",
                     str(job_dir), "--set", "NUM_TRAIN_STEPS=2", "--no-eval-on-test")
    assert result.returncode == 0, result.stderr
    return next(r for r in read_metrics(job_dir) if r["kind"] == "start")


def _entries(folder: Path, program: str) -> dict[str, bytes]:
    """The program's cache entries and their last-use stamps (rewritten on every read)."""
    return {p.name: p.read_bytes() for p in folder.glob(f"jit_{program}-*-atime")}


def test_a_rerun_reads_the_compiled_step_and_off_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("PAX_COMPILATION_CACHE", str(tmp_path / "xla"))
    folder = tmp_path / "xla" / VERSIONS
    assert _train(tmp_path / "first")["compilation_cache"] == str(folder)
    written = _entries(folder, "train_step")
    assert len(written) == 1
    _train(tmp_path / "again")
    read = _entries(folder, "train_step")
    assert read.keys() == written.keys()  # the same program, not compiled into a new entry
    assert read != written  # and read back: its last use moved
    monkeypatch.setenv("PAX_COMPILATION_CACHE", "off")
    entries = sorted(p.name for p in folder.iterdir())
    assert _train(tmp_path / "off")["compilation_cache"] == "off"
    assert sorted(p.name for p in folder.iterdir()) == entries
