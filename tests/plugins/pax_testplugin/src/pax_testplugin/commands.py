"""The test plugin's subcommand: shows what the counting input produces."""

from typing import Annotated

import typer

from pax_testplugin.inputs import CountingInput


def sample(rows: Annotated[int, typer.Option(help="How many rows to print.")] = 2,
           seed: Annotated[int, typer.Option(help="Input seed.")] = 1) -> None:
    """Print the first rows of the counting input's first batch."""
    batch = CountingInput(batch_size=rows, seed=seed).get_next()
    for row in batch["ids"]:
        typer.echo(" ".join(str(t) for t in row))
