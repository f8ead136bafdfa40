"""``pax tokenizer``: train a SentencePiece model on local text, and try a tokenizer.

Mistakes (a missing input, an empty corpus, a vocabulary too large for the text) raise
``UsageError``, which ``pax`` prints as one line with exit code 2.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pax_lm.tokenizers import tokenizer_from_path, train_sentencepiece

app = typer.Typer(help="Train and try tokenizers.", no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False, rich_markup_mode=None)


@app.command()
def train(
    input_path: Annotated[Path, typer.Option(
        "--input", help="A .txt or .jsonl file, or a folder of them (searched recursively).")],
    output: Annotated[str, typer.Option(
        "--output", help="DIR/NAME: writes DIR/NAME.model and DIR/NAME.vocab.")],
    vocab_size: Annotated[int, typer.Option(help="Number of pieces, special ones included.")]
    = 8000,
    model_type: Annotated[str, typer.Option(help="unigram or bpe.")] = "unigram",
    text_key: Annotated[str, typer.Option(help="The text field of JSONL records.")] = "text",
    max_sentences: Annotated[int, typer.Option(
        help="Train on at most this many lines (a seeded sample): time grows with the text.")]
    = 100_000,
) -> None:
    """Train a SentencePiece model that round-trips text exactly (byte fallback, no
    normalization) and print the path of the .model file."""
    typer.echo(train_sentencepiece(input_path, output, vocab_size, model_type=model_type,
                                   max_sentences=max_sentences, text_key=text_key))


@app.command()
def encode(
    text: Annotated[str, typer.Argument(help="The text to tokenize.")],
    tokenizer: Annotated[str, typer.Option(
        help="'bytes', a SentencePiece .model file or a Hugging Face .json file.")] = "bytes",
) -> None:
    """Print the ids of TEXT, then the text they decode to."""
    tok = tokenizer_from_path(tokenizer)
    ids = tok.encode(text)
    typer.echo(" ".join(map(str, ids)))
    typer.echo(f"{len(ids)} ids; decoded: {tok.decode(ids)!r}")
