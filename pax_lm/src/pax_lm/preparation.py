"""``pax data prepare``: source files tokenized into a prepared dataset (``pax_lm.data.shards``).

This process reads the sources in order and cuts their documents into chunks of about
``shard_mb`` megabytes of text; worker processes tokenize each chunk and write it as one shard,
in parallel. A shard is complete when its mark (``.prepare/shard-NNNNN.json``) exists: the shard
file is renamed into place first, then the mark written. An interrupted preparation is resumed by
the same command: the plan (sources, tokenizer, settings) must be the one recorded in
``.prepare/plan.json``; chunks whose shard is complete are read past, not tokenized again. The
index and ``metadata.json`` are written last, and the ``.prepare`` folder removed.

With ``chat``, the sources are conversations read as ``SFT_DATA`` reads them
(``pax_lm.sft.conversations``: a ``.jsonl`` file or a folder of them), checked line by line as
it checks them; the workers write each with the chat template as ``ChatInput`` does
(``pax_lm.sft.templates``) and store its tokens with its loss mask, and the hash that places it
in a split. A bad line or a template's refusal leaves nothing in the output, shards written
before it included: the source or the template must change to go on, which makes them another
preparation's anyway.
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
from pax_lm.sft import conversations
from pax_lm.sft.conversations import Conversation, file_conversations
from pax_lm.sft.templates import ChatTemplate, chat_template
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


def plan_of(files: list[Path], tokenizer: Tokenizer, field: str | None, shard_mb: float,
            template: ChatTemplate | None = None, template_spec: str | None = None
            ) -> dict[str, Any]:
    """What a preparation makes: equal plans make equal datasets. ``template`` (conversations
    only) is the chat template ``template_spec`` names."""
    plan = {
        "format": shards.FORMAT, "version": shards.VERSION,
        "tokenizer": {"name": tokenizer.name, "vocab_size": tokenizer.vocab_size,
                      "fingerprint": tokenizer.fingerprint},
        "dtype": shards.token_dtype(tokenizer.vocab_size).str,
        "field": field, "shard_chars": int(shard_mb * (1 << 20)),
        "sources": [{"path": str(f.resolve()), "bytes": f.stat().st_size,
                     "mtime_ns": f.stat().st_mtime_ns} for f in files],
    }
    if template is not None:
        plan["chat_template"] = {**template.identity, "spec": template_spec}
    return plan


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
    differing += [key for key in recorded if key not in plan]
    names = {"shard_chars": "--shard-mb", "field": "--field", "tokenizer": "--tokenizer",
             "chat_template": "--chat/--chat-template"}
    return "settings: " + ", ".join(names.get(key, key) for key in differing)


def _unclaim(output: Path) -> None:
    """Remove what ``_claim`` made of a preparation that wrote no shard."""
    shutil.rmtree(output / PROGRESS)
    (output / shards.SHARDS).rmdir()
    if not any(output.iterdir()):
        output.rmdir()


def _chunks(files: list[Path], field: str | None, shard_chars: int, hashes: dict[str, str]
            ) -> Iterator[list[str] | list[Conversation]]:
    """The documents of the sources (conversations where ``field`` is None) in chunks of about
    ``shard_chars`` characters; records each file's SHA-256 in ``hashes`` as it is reached."""
    chunk, size = [], 0
    for file in files:
        with open(file, "rb") as f:
            hashes[str(file.resolve())] = hashlib.file_digest(f, "sha256").hexdigest()
        items = (file_conversations(file) if field is None
                 else sources.documents(file, field))
        for item in items:
            chunk.append(item)
            size += (len(item) if field is not None
                     else sum(len(m["content"]) for m in item.messages))
            if size >= shard_chars:
                yield chunk
                chunk, size = [], 0
    if chunk:
        yield chunk


_worker_tokenizer: Tokenizer | None = None
_worker_template: ChatTemplate | None = None


def _start_worker(tokenizer_name: str, template: str | None, chat: bool) -> None:
    """Load the tokenizer (and, for conversations, the chat template) once per worker process
    (the processes share nothing). A Ctrl-C at a terminal reaches the whole process group: the
    workers leave it to this process, which stops them (``_in_workers``)."""
    global _worker_tokenizer, _worker_template
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _worker_tokenizer = tokenizer_from_path(tokenizer_name)
    if chat:
        _worker_template = chat_template(_worker_tokenizer, template)


def write_shard(output: str, number: int, items: list[str] | list[Conversation], dtype: str,
                tokenizer: Tokenizer | None = None, template: ChatTemplate | None = None
                ) -> dict[str, Any]:
    """Tokenize ``items`` (texts, or conversations written with the chat template: the
    worker's, else ``template``) into shard ``number`` of ``output``; returns its record (the
    shard mark's contents). Runs in a worker process."""
    from array_record.python.array_record_module import ArrayRecordWriter

    in_worker = tokenizer is None
    tokenizer = tokenizer or _worker_tokenizer
    template = template or _worker_template
    chat = bool(items) and isinstance(items[0], Conversation)
    root = Path(output)
    name = shards.shard_name(number)
    # One thread a worker: the workers already keep every core busy.
    threads = 1 if in_worker else None
    if chat:
        sequences = template.encode(items, tokenizer, num_threads=threads)
        records = [shards.masked_record(ids, trained, dtype) for ids, trained in sequences]
        lengths = np.array([len(ids) for ids, _ in sequences], np.uint32)
        np.save(_progress_file(root, "hashes", number, ".npy"),
                conversations.conversation_hashes(items))
    else:
        ids = tokenizer.encode_batch(items, num_threads=threads)
        records = [np.asarray(doc, dtype).tobytes() for doc in ids]
        lengths = np.array([len(doc) for doc in ids], np.uint32)
    partial = root / (name + ".partial")
    writer = ArrayRecordWriter(str(partial), shards.WRITER_OPTIONS)
    try:
        for record in records:
            writer.write(record)
    finally:
        writer.close()
    os.replace(partial, root / name)
    np.save(_progress_file(root, "lengths", number, ".npy"), lengths)
    record = {"number": number, "name": name, "documents": len(lengths),
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
            on_shard: Callable[[dict[str, Any], float], None] | None = None,
            chat: bool = False, template: str | None = None) -> dict[str, Any]:
    """Prepare ``source`` into ``output`` (see the module's docstring); returns the metadata.
    ``on_shard(record, seconds)`` is told of each shard as it completes (progress). With
    ``chat``, ``source`` holds conversations, written with the chat ``template`` (None: the
    tokenizer's own, else the plain one; ``"plain"``; or a ``.jinja`` file), as ``SFT_DATA``
    with ``CHAT_TEMPLATE`` would be."""
    if shard_mb <= 0:
        raise UsageError(f"--shard-mb must be above 0, got {shard_mb}")
    workers = max(1, (os.cpu_count() or 1)) if workers is None else workers
    if workers < 0:
        raise UsageError(f"--workers must be >= 0, got {workers}")
    if template is not None and not chat:
        raise UsageError("--chat-template writes conversations: add --chat (the source holds "
                         "conversations), or leave it out for text")
    if chat and pattern is not None:
        raise UsageError("--pattern picks text sources; with --chat the source is what "
                         "SFT_DATA takes (a .jsonl file or a folder of them): leave it out")
    root = Path(output)
    tok = tokenizer_from_path(tokenizer)
    if chat:
        files = conversations.conversation_files(source)  # .jsonl files: never the output's
        made = chat_template(tok, template)
        plan = plan_of(files, tok, None, shard_mb, made, template)
        nothing = conversations.no_records(source, "conversation", conversations.FORMS)
    else:
        files = sources.source_files(source, pattern, exclude=root)
        made = None
        plan = plan_of(files, tok, field, shard_mb)
        nothing = UsageError(f"no text in {', '.join(map(str, files[:3]))}"
                             f"{' ...' if len(files) > 3 else ''}: every document is empty "
                             f"(nothing was written)")
    _claim(root, plan)
    try:
        return _prepare(root, files, tok, made, plan, workers, on_shard, nothing)
    except UsageError:
        # A source's mistake: nothing stays behind when no shard was made, or (conversations)
        # when the source or the template must change to go on.
        if chat:
            _discard(root)
        elif not _done(root):
            _unclaim(root)
        raise
    except OSError as e:  # a full disk, a vanished output: the preparation resumes later
        raise RunError(f"writing {root} failed: {e.strerror or e}; complete shards are kept, "
                       f"run the same command again to resume") from None


def _discard(output: Path) -> None:
    """Remove all a preparation made in ``output`` (it claimed an empty or new folder)."""
    for name in (PROGRESS, shards.SHARDS):
        shutil.rmtree(output / name, ignore_errors=True)
    for partial in output.glob("*.partial*"):
        partial.unlink()
    if output.is_dir() and not any(output.iterdir()):
        output.rmdir()


def _prepare(root: Path, files: list[Path], tok: Tokenizer, template: ChatTemplate | None,
             plan: dict[str, Any], workers: int,
             on_shard: Callable[[dict[str, Any], float], None] | None,
             nothing: UsageError) -> dict[str, Any]:
    """The preparation of a claimed output; ``nothing`` is the refusal of sources without a
    document."""
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
                done[number] = write_shard(str(root), number, texts, plan["dtype"], tok,
                                           template)
                report(done[number])
    else:
        done.update(_in_workers(root, chunks, done, plan, workers, report))
    if not done:
        raise nothing
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
            initargs=(plan["tokenizer"]["name"], plan.get("chat_template", {}).get("spec"),
                      "chat_template" in plan)) as pool:
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
    _save(root / shards.INDEX, index)
    chat = "chat_template" in plan
    if chat:
        _save(root / shards.HASHES, np.concatenate(
            [np.load(_progress_file(root, "hashes", r["number"], ".npy")) for r in records]))
    metadata = {
        "format": shards.FORMAT, "version": shards.VERSION, "tokenizer": plan["tokenizer"],
        "dtype": plan["dtype"], "field": plan["field"], "loss_mask": chat,
        "documents": int(sum(r["documents"] for r in records)),
        "tokens": int(sum(r["tokens"] for r in records)),
        "shards": [{k: v for k, v in r.items() if k != "number"} for r in records],
        "sources": [{"path": s["path"], "bytes": s["bytes"], "sha256": hashes[s["path"]]}
                    for s in plan["sources"]],
    }
    if chat:
        metadata["chat_template"] = {k: plan["chat_template"][k] for k in ("name", "fingerprint")}
    _write_json(root / shards.METADATA, metadata)
    shutil.rmtree(progress)
    return metadata


def _save(path: Path, array: np.ndarray) -> None:
    """``array`` as the ``.npy`` file ``path``, replaced whole."""
    partial = path.with_name(path.stem + ".partial.npy")
    np.save(partial, array)
    os.replace(partial, path)
