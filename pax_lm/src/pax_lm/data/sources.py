"""Documents streamed from the files a user has: the sources of ``pax data prepare``.

Kinds, by file name: plain text (``.txt``, one document, cut at blank lines when very large,
as ``pax_lm.corpus`` does; read whole), JSON lines (``.jsonl``, ``.jsonl.gz``,
``.json.gz`` as C4's release ships them; one document a line, in a field), Parquet
(``.parquet``; a column), and TFDS's ArrayRecord files
(``NAME-SPLIT.array_record-00000-of-01024``, as ``tfds build`` writes ``c4/en``; one serialized
``tf.train.Example`` a record, a bytes feature). JSON lines, Parquet and ArrayRecord files are
streamed, so a source of any size needs memory for one document (one row group of a Parquet
file) at a time.
"""

from __future__ import annotations

import fnmatch
import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path

from pax_core import UsageError
from pax_lm.corpus import file_documents

TEXT, JSONL, PARQUET, TFDS = "text", "jsonl", "parquet", "tfds"
PARQUET_EXTRA = 'pip install "pax-lm[parquet]"'


def file_kind(path: Path) -> str | None:
    """The kind of a source file by its name, None for a file that is not a source."""
    name = path.name
    if name.endswith((".jsonl", ".jsonl.gz", ".json.gz")):
        return JSONL
    if name.endswith(".txt"):
        return TEXT
    if name.endswith(".parquet"):
        return PARQUET
    if ".array_record" in name:
        return TFDS
    return None


def source_files(source: str | Path, pattern: str | None = None,
                 exclude: Path | None = None) -> list[Path]:
    """The source files of ``source`` (a file, or a folder searched recursively, hidden entries
    skipped), sorted by path; ``pattern`` keeps the file names that match a glob
    (``c4-train.*``). Files under ``exclude`` (the output, when it lies inside the source) are
    not sources."""
    root = Path(source)
    if not root.exists():
        raise UsageError(f"no such file or folder: {root}")
    if root.is_file():
        if file_kind(root) is None:
            raise UsageError(f"{root}: not a source file (.txt, .jsonl, .jsonl.gz, .json.gz, "
                             f".parquet or TFDS .array_record)")
        return [root]
    outside = exclude.resolve() if exclude is not None else None
    files = sorted(p for p in root.rglob("*")
                   if p.is_file() and file_kind(p) is not None
                   and not any(part.startswith(".") for part in p.relative_to(root).parts)
                   and (pattern is None or fnmatch.fnmatch(p.name, pattern))
                   and (outside is None or not p.resolve().is_relative_to(outside)))
    if not files:
        which = f" matching {pattern!r}" if pattern else ""
        raise UsageError(f"no source files{which} under {root} (.txt, .jsonl, .jsonl.gz, "
                         f".json.gz, .parquet or TFDS .array_record)")
    return files


def documents(file: Path, field: str = "text") -> Iterator[str]:
    """The non-blank documents of one source file, in order."""
    kind = file_kind(file)
    texts = {TEXT: lambda: file_documents(file), JSONL: lambda: _jsonl(file, field),
             PARQUET: lambda: _parquet(file, field), TFDS: lambda: _tfds(file, field)}[kind]()
    return (text for text in texts if text.strip())


def _jsonl(file: Path, field: str) -> Iterator[str]:
    opener = gzip.open if file.suffix == ".gz" else open
    try:
        with opener(file, "rb") as raw:
            # Only a newline ends a record: JSON strings may hold U+2028 unescaped.
            for number, line in enumerate(io.TextIOWrapper(raw, "utf-8", newline="\n"), 1):
                if line.strip():
                    yield _field(_json(line, file, number), field, f"{file}:{number}")
    except UnicodeDecodeError as e:
        raise UsageError(f"{file}: not UTF-8 text ({e.reason})") from None
    except (OSError, EOFError) as e:
        raise UsageError(f"cannot read {file}: {getattr(e, 'strerror', None) or e}") from None


def _json(line: str, file: Path, number: int) -> object:
    try:
        return json.loads(line)
    except json.JSONDecodeError as e:
        raise UsageError(f"{file}:{number}: invalid JSON ({e.msg})") from None


def _field(record: object, field: str, where: str) -> str:
    if not isinstance(record, dict) or field not in record:
        fields = ", ".join(record) if isinstance(record, dict) else type(record).__name__
        raise UsageError(f"{where}: no field '{field}' (has: {fields}); give --field")
    text = record[field]
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not isinstance(text, str):
        raise UsageError(f"{where}: field '{field}' is {type(text).__name__}, not text")
    return text


def _parquet(file: Path, field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise UsageError(f"{file}: reading Parquet needs pyarrow: {PARQUET_EXTRA}") from None
    try:
        table = pq.ParquetFile(file)
    except Exception as e:  # pyarrow's ArrowInvalid and OSError subclasses
        raise UsageError(f"{file}: not a Parquet file ({e})") from None
    names = table.schema_arrow.names
    if field not in names:
        raise UsageError(f"{file}: no column '{field}' (has: {', '.join(names)}); give --field")
    for batch in table.iter_batches(columns=[field]):
        yield from (text for text in batch.column(0).to_pylist() if isinstance(text, str))


def _tfds(file: Path, field: str) -> Iterator[str]:
    from array_record.python.array_record_module import ArrayRecordReader

    from pax_lm.data import tf_example
    from pax_lm.data.shards import short

    try:
        reader = ArrayRecordReader(str(file))
    except (OSError, RuntimeError, ValueError) as e:
        raise UsageError(f"{file}: not an ArrayRecord file ({short(e)})") from None
    try:
        total = reader.num_records()
        for start in range(0, total, 1024):
            for number, record in enumerate(reader.read(start, min(start + 1024, total)), start):
                yield tf_example.text_feature(record, field, f"{file}#{number}")
    finally:
        reader.close()
