"""``pax data prepare``: source files tokenized into a prepared dataset (``pax_lm.data.shards``).

This process reads the sources in order and cuts their documents into chunks of about
``shard_mb`` megabytes of text; worker processes tokenize each chunk and write it as one shard,
in parallel. A shard is complete when its mark (``.prepare/shard-NNNNN.json``) exists: the shard
file is renamed into place first, then the mark written. An interrupted preparation is resumed by
the same command: the plan (sources, tokenizer, settings) must be the one recorded in
``.prepare/plan.json``; chunks whose shard is complete are read past, not tokenized again. The
index and ``metadata.json`` are written last, and the ``.prepare`` folder removed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pax_core import RunError, UsageError
from pax_lm.data import shards, sources
from pax_lm.tokenizers import Tokenizer, tokenizer_from_path

PROGRESS = ".prepare"
PLAN = "plan.json"


def _write_json(path: Path, value: Any) -> None:
    """``value`` as ``path``, replaced whole (a kill or a power cut leaves the old file or the
    new one)."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w") as f:
        json.dump(value, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def plan_of(files: list[Path], tokenizer: Tokenizer, field: str, shard_mb: float
            ) -> dict[str, Any]:
    """What a preparation makes: equal plans make equal datasets."""
    return {
        "format": shards.FORMAT, "version": shards.VERSION,
        "tokenizer": {"name": tokenizer.name, "vocab_size": tokenizer.vocab_size,
                      "fingerprint": tokenizer.fingerprint},
        "dtype": shards.token_dtype(tokenizer.vocab_size).str,
        "field": field, "shard_chars": int(shard_mb * (1 << 20)),
        "sources": [{"path": str(f.resolve()), "bytes": f.stat().st_size,
                     "mtime_ns": f.stat().st_mtime_ns} for f in files],
    }


def _claim(output: Path, plan: dict[str, Any]) -> None:
    """Make ``output`` this plan's, or refuse: never over a dataset or other files."""
    progress, metadata = output / PROGRESS, output / shards.METADATA
    if metadata.exists():
        raise UsageError(f"{output} already holds a prepared dataset; give another --output "
                         f"(nothing was changed)")
    if (progress / PLAN).is_file():
        try:
            recorded = json.loads((progress / PLAN).read_text())
        except ValueError:
            recorded = None
        if recorded != plan:
            raise UsageError(f"{output} holds an unfinished preparation of other "
                             f"{_difference(recorded, plan)}; run the command that started it, "
                             f"or remove it, or give another --output (nothing was changed)")
        return
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise UsageError(f"{output} exists and is not empty; give a new --output (nothing was "
                         f"changed)")
    (output / shards.SHARDS).mkdir(parents=True, exist_ok=True)
    progress.mkdir(exist_ok=True)
    _write_json(progress / PLAN, plan)


def _difference(recorded: Any, plan: dict[str, Any]) -> str:
    """What differs between two plans, in a user's words."""
    if not isinstance(recorded, dict):
        return "settings"
    if recorded.get("sources") != plan["sources"]:
        return "sources (files added, removed or changed since)"
    differing = [key for key in plan if recorded.get(key) != plan[key]]
    names = {"shard_chars": "--shard-mb", "field": "--field", "tokenizer": "--tokenizer"}
    return "settings: " + ", ".join(names.get(key, key) for key in differing)


def _unclaim(output: Path) -> None:
    """Remove what ``_claim`` made of a preparation that wrote no shard."""
    shutil.rmtree(output / PROGRESS)
    (output / shards.SHARDS).rmdir()
    if not any(output.iterdir()):
        output.rmdir()


def _chunks(files: list[Path], field: str, shard_chars: int, hashes: dict[str, str]
            ) -> Iterator[list[str]]:
    """The documents of the sources in chunks of about ``shard_chars`` characters; records
    each file's SHA-256 in ``hashes`` as it is reached."""
    chunk, size = [], 0
    for file in files:
        with open(file, "rb") as f:
            hashes[str(file.resolve())] = hashlib.file_digest(f, "sha256").hexdigest()
        for text in sources.documents(file, field):
            chunk.append(text)
            size += len(text)
            if size >= shard_chars:
                yield chunk
                chunk, size = [], 0
    if chunk:
        yield chunk


_worker_tokenizer: Tokenizer | None = None


def _start_worker(tokenizer_name: str) -> None:
    """Load the tokenizer once per worker process (the processes share nothing). A Ctrl-C at a
    terminal reaches the whole process group: the workers leave it to this process, which
    stops them (``_in_workers``)."""
    global _worker_tokenizer
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_tokenizer = tokenizer_from_path(tokenizer_name)


def write_shard(output: str, number: int, texts: list[str], dtype: str,
                tokenizer: Tokenizer | None = None) -> dict[str, Any]:
    """Tokenize ``texts`` into shard ``number`` of ``output``; returns its record (the shard
    mark's contents). Runs in a worker process."""
    from array_record.python.array_record_module import ArrayRecordWriter

    in_worker = tokenizer is None
    tokenizer = tokenizer or _worker_tokenizer
    root = Path(output)
    name = shards.shard_name(number)
    # One thread a worker: the workers already keep every core busy.
    ids = tokenizer.encode_batch(texts, num_threads=1 if in_worker else None)
    partial = root / (name + ".partial")
    writer = ArrayRecordWriter(str(partial), shards.WRITER_OPTIONS)
    try:
        for doc in ids:
            writer.write(np.asarray(doc, dtype).tobytes())
    finally:
        writer.close()
    os.replace(partial, root / name)
    lengths = np.array([len(doc) for doc in ids], np.uint32)
    np.save(_progress_file(root, "lengths", number, ".npy"), lengths)
    record = {"number": number, "name": name, "documents": len(ids),
              "tokens": int(lengths.sum()), "bytes": (root / name).stat().st_size}
    _write_json(_progress_file(root, "shard", number, ".json"), record)
    return record


def _progress_file(root: Path, kind: str, number: int, suffix: str) -> Path:
    return root / PROGRESS / f"{kind}-{number:05d}{suffix}"


def _done(output: Path) -> dict[int, dict[str, Any]]:
    """The complete shards: a mark whose shard file is there with the size it was written
    with (one lost since is made again)."""
    done = {}
    for mark in sorted((output / PROGRESS).glob("shard-*.json")):
        record = json.loads(mark.read_text())
        shard = output / record["name"]
        if shard.is_file() and shard.stat().st_size == record["bytes"]:
            done[record["number"]] = record
    return done


def prepare(source: str | Path, output: str | Path, tokenizer: str = "bytes",
            field: str = "text", pattern: str | None = None, workers: int | None = None,
            shard_mb: float = 32.0,
            on_shard: Callable[[dict[str, Any], float], None] | None = None) -> dict[str, Any]:
    """Prepare ``source`` into ``output`` (see the module's docstring); returns the metadata.
    ``on_shard(record, seconds)`` is told of each shard as it completes (progress)."""
    if shard_mb <= 0:
        raise UsageError(f"--shard-mb must be above 0, got {shard_mb}")
    workers = max(1, (os.cpu_count() or 1)) if workers is None else workers
    if workers < 0:
        raise UsageError(f"--workers must be >= 0, got {workers}")
    root = Path(output)
    files = sources.source_files(source, pattern, exclude=root)
    tok = tokenizer_from_path(tokenizer)
    plan = plan_of(files, tok, field, shard_mb)
    _claim(root, plan)
    try:
        return _prepare(root, files, tok, plan, workers, on_shard)
    except UsageError:
        if not _done(root):  # a source's mistake before any shard: nothing stays behind
            _unclaim(root)
        raise
    except OSError as e:  # a full disk, a vanished output: the preparation resumes later
        raise RunError(f"writing {root} failed: {e.strerror or e}; complete shards are kept, "
                       f"run the same command again to resume") from None


def _prepare(root: Path, files: list[Path], tok: Tokenizer, plan: dict[str, Any],
             workers: int, on_shard: Callable[[dict[str, Any], float], None] | None
             ) -> dict[str, Any]:
    done, hashes, started = _done(root), {}, time.perf_counter()
    chunks = enumerate(_chunks(files, plan["field"], plan["shard_chars"], hashes))

    def report(record: dict[str, Any]) -> None:
        if on_shard is not None:
            on_shard(record, time.perf_counter() - started)

    for record in done.values():
        report(record)
    if workers == 0:
        for number, texts in chunks:
            if number not in done:
                done[number] = write_shard(str(root), number, texts, plan["dtype"], tok)
                report(done[number])
    else:
        done.update(_in_workers(root, chunks, done, plan, workers, report))
    if not done:
        raise UsageError(f"no text in {', '.join(map(str, files[:3]))}"
                         f"{' ...' if len(files) > 3 else ''}: every document is empty "
                         f"(nothing was written)")
    return _finish(root, plan, [done[n] for n in sorted(done)], hashes)


def _in_workers(root: Path, chunks: Iterator[tuple[int, list[str]]],
                done: dict[int, dict[str, Any]], plan: dict[str, Any], workers: int,
                report: Callable[[dict[str, Any]], None]) -> dict[int, dict[str, Any]]:
    """Shards written by ``workers`` processes, at most two chunks each in flight (the reader
    never runs far ahead of the tokenizers, whatever the source's size).

    When this is interrupted (Ctrl-C, a stop request the command turns into one, a failed
    shard), the workers are terminated, not waited for: a shard they were writing is left
    incomplete (it has no mark) and is written again by the next run, and no worker outlives
    the command."""
    made: dict[int, dict[str, Any]] = {}
    context = multiprocessing.get_context("spawn")  # no state of this process leaks in
    before = set(multiprocessing.active_children())
    with concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=context, initializer=_start_worker,
            initargs=(plan["tokenizer"]["name"],)) as pool:
        pending: set[concurrent.futures.Future] = set()
        try:
            for number, texts in chunks:
                if number in done:
                    continue
                with _interrupts_held():  # a submit may start a worker
                    pending.add(pool.submit(write_shard, str(root), number, texts,
                                            plan["dtype"]))
                while len(pending) >= 2 * workers:
                    finished, pending = concurrent.futures.wait(
                        pending, return_when=concurrent.futures.FIRST_COMPLETED)
                    _collect(finished, made, report)
            _collect(concurrent.futures.wait(pending)[0], made, report)
        except BaseException:
            # The pool's own processes: those started since it was made (the executor has no
            # public way to stop them before Python 3.14's terminate_workers).
            for process in set(multiprocessing.active_children()) - before:
                process.terminate()
            pool.shutdown(cancel_futures=True)
            raise
    return made


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Hold back SIGINT in this thread for a moment: a worker started meanwhile inherits the
    mask, so a Ctrl-C at a terminal (which reaches the whole process group) while it imports
    does not end it with a traceback. This process still receives the signal (another thread
    takes it, or this one once the mask is restored)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _collect(finished: set[concurrent.futures.Future], made: dict[int, dict[str, Any]],
             report: Callable[[dict[str, Any]], None]) -> None:
    for future in finished:
        record = future.result()
        made[record["number"]] = record
        report(record)


def _finish(root: Path, plan: dict[str, Any], records: list[dict[str, Any]],
            hashes: dict[str, str]) -> dict[str, Any]:
    """The index and metadata of the complete shards; then the progress folder goes."""
    progress = root / PROGRESS
    index = np.concatenate([np.load(_progress_file(root, "lengths", r["number"], ".npy"))
                            for r in records])
    partial = root / (shards.INDEX + ".partial.npy")
    np.save(partial, index)
    os.replace(partial, root / shards.INDEX)
    metadata = {
        "format": shards.FORMAT, "version": shards.VERSION, "tokenizer": plan["tokenizer"],
        "dtype": plan["dtype"], "field": plan["field"],
        "documents": int(sum(r["documents"] for r in records)),
        "tokens": int(sum(r["tokens"] for r in records)),
        "shards": [{k: v for k, v in r.items() if k != "number"} for r in records],
        "sources": [{"path": s["path"], "bytes": s["bytes"], "sha256": hashes[s["path"]]}
                    for s in plan["sources"]],
    }
    _write_json(root / shards.METADATA, metadata)
    shutil.rmtree(progress)
    return metadata
