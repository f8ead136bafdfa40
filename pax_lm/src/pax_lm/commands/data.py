"""``pax data``: prepare token datasets from text or conversations, and look inside one.

Mistakes (a missing source, an output that holds something else, a damaged dataset) raise
``UsageError``: one line, exit code 2, nothing written. A preparation asked to stop (Ctrl-C,
SIGTERM) stops its workers, keeps its complete shards and exits as ``pax train`` does: 128 +
the signal (130, 143), one line.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from pax_core import Stopped

app = typer.Typer(help="Prepare and inspect token datasets (ArrayRecord shards).",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None)


@app.command()
def prepare(
    source: Annotated[Path, typer.Argument(
        help="A file or a folder (searched recursively) of .txt, .jsonl, .jsonl.gz, .json.gz, "
             ".parquet or TFDS .array_record files; with --chat, a .jsonl file of "
             "conversations or a folder of them (as SFT_DATA takes).")],
    output: Annotated[Path, typer.Option("--output", help="The dataset directory to write.")],
    tokenizer: Annotated[str, typer.Option(
        help="'bytes', a SentencePiece .model file or a Hugging Face .json file.")] = "bytes",
    field: Annotated[str | None, typer.Option(
        help="The text field of JSON lines, the column of Parquet, the feature of TFDS "
             "records (default: text).")] = None,
    pattern: Annotated[str | None, typer.Option(
        help="Only files whose name matches this glob ('c4-train.*').")] = None,
    workers: Annotated[int | None, typer.Option(
        help="Tokenizing processes (default: one per CPU; 0: in this process).")] = None,
    shard_mb: Annotated[float, typer.Option(help="Megabytes of text per shard.")] = 32.0,
    chat: Annotated[bool, typer.Option(
        "--chat", help="SOURCE holds conversations to fine-tune on (SFT_DATA's JSON lines): "
                       "store each as its chat template writes it, with its loss mask.")
                    ] = False,
    chat_template: Annotated[str | None, typer.Option(
        help="With --chat: 'plain' or a .jinja file (default: the tokenizer's own, else "
             "plain), as CHAT_TEMPLATE.")] = None,
) -> None:
    """Tokenize SOURCE into ArrayRecord shards with an index and metadata; run the same command
    again to resume an interrupted preparation (complete shards are kept). With --chat, train
    on the result with SFT_DATA=OUTPUT."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from pax_core import UsageError
    from pax_lm.preparation import prepare as run_prepare

    if chat and field is not None:
        raise UsageError("--field names the text of text sources; conversations are read in "
                         "SFT_DATA's forms: leave it out with --chat")

    console = Console(stderr=True)
    columns = (TextColumn("preparing"), BarColumn(), TimeElapsedColumn(),
               TextColumn("{task.fields[counts]}"))
    seen = {"documents": 0, "tokens": 0}
    with Progress(*columns, console=console, disable=not console.is_terminal) as progress:
        task = progress.add_task("prepare", total=None, counts="")

        def on_shard(record: dict[str, Any], seconds: float) -> None:
            seen["documents"] += record["documents"]
            seen["tokens"] += record["tokens"]
            progress.update(task, counts=_rates(seen, seconds))

        with _stop_requests() as received:
            try:
                metadata = run_prepare(source, output, tokenizer, field or "text", pattern,
                                       workers, shard_mb, on_shard=on_shard, chat=chat,
                                       template=chat_template)
            except KeyboardInterrupt:
                signum = received.get("signal", signal.SIGINT)
                raise Stopped(f"stopped on request ({signal.Signals(signum).name}); the "
                              f"{seen['documents']:,} documents of complete shards are kept in "
                              f"{output}: run the same command to resume", signum) from None
    what = "conversations" if chat else "documents"
    typer.echo(f"prepared {metadata['documents']:,} {what}, {metadata['tokens']:,} tokens in "
               f"{len(metadata['shards'])} shards: {output}")


@contextlib.contextmanager
def _stop_requests() -> Iterator[dict[str, int]]:
    """Turn SIGTERM (a scheduler's, ``kill``'s) into what Ctrl-C is, a ``KeyboardInterrupt``,
    so that both stop the workers and keep the complete shards; the dict yielded receives the
    signal. Further requests while stopping are ignored: the workers are being terminated."""
    received: dict[str, int] = {}

    def request_stop(signum: int, _frame: Any) -> None:
        if "signal" not in received:
            received["signal"] = signum
            raise KeyboardInterrupt

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _rates(seen: dict[str, int], seconds: float) -> str:
    seconds = max(seconds, 1e-9)
    return (f"{seen['documents']:,} documents ({seen['documents'] / seconds:,.0f}/s), "
            f"{seen['tokens']:,} tokens ({seen['tokens'] / seconds:,.0f}/s)")


@app.command()
def inspect(
    directory: Annotated[Path, typer.Argument(help="A prepared dataset directory.")],
    records: Annotated[int, typer.Option(help="How many documents to decode.")] = 3,
    chars: Annotated[int, typer.Option(help="Characters shown of each.")] = 200,
    verify: Annotated[bool, typer.Option(
        help="Read every record (ArrayRecord checks its hashes): finds damage a run would "
             "only meet when it reads the damaged part.")] = False,
) -> None:
    """Print a prepared dataset's counts, tokenizer and sources, and decode a few documents."""
    import numpy as np

    from pax_lm.data.shards import PreparedDataset
    data = PreparedDataset.open(directory, content=None)
    lengths = np.asarray(data.index)
    tok = data.tokenizer
    what = "conversations" if data.loss_mask else "documents"
    typer.echo(f"{directory}: {data.num_documents:,} {what}, {data.num_tokens:,} tokens, "
               f"{len(data.shards)} shards ({sum(s.bytes for s in data.shards):,} bytes)")
    typer.echo(f"tokenizer {tok['name']} (vocabulary {tok['vocab_size']:,}, {tok['fingerprint']}),"
               f" tokens stored as {data.dtype.name}")
    if data.loss_mask:
        template = data.chat_template
        typer.echo(f"conversations written with the chat template {template['name']} "
                   f"({template['fingerprint']}), each with its loss mask")
    typer.echo(f"document tokens: mean {lengths.mean():,.1f}, median {np.median(lengths):,.0f}, "
               f"max {lengths.max():,}")
    if verify:
        tokens = sum(data.verify_shard(number) for number in range(len(data.shards)))
        typer.echo(f"verified: every record of the {len(data.shards)} shards reads "
                   f"({tokens:,} tokens)")
    for source in data.metadata["sources"]:
        typer.echo(f"source {source['path']} ({source['bytes']:,} bytes, sha256 "
                   f"{source['sha256'][:16]})")
    shown = list(range(min(records, data.num_documents)))
    decode = _decoder(tok)
    for number, (ids, trained) in zip(shown, data.masked_tokens(shown), strict=True):
        text = decode(ids) if decode else " ".join(map(str, ids[:chars // 4]))
        loss = "" if trained is None else f" ({int(trained.sum())} trained)"
        typer.echo(f"[{number}] {len(ids)} tokens{loss}: {text[:chars]!r}")


def _decoder(recorded: dict[str, Any]) -> Callable[[Iterable[int]], str] | None:
    """The decode function of the dataset's tokenizer, None where its model file is gone or
    changed (the ids are shown instead)."""
    from pax_core import UsageError
    from pax_lm.tokenizers import tokenizer_from_path

    try:
        tokenizer = tokenizer_from_path(recorded["name"])
        return tokenizer.decode if tokenizer.fingerprint == recorded["fingerprint"] else None
    except UsageError:
        return None
