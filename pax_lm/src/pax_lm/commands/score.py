"""``pax score``: the log-likelihood of continuations given contexts, from a language-model job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import typer

from pax_core import JobRequest, UsageError, job_command, require_files
from pax_lm.commands.lm_jobs import check_output, restore_lm, written_whole
from pax_lm.quantization import MODES

FIELDS = ("context", "continuation")


@job_command
def score(
    job: JobRequest,
    requests: Annotated[Path, typer.Argument(help="A .jsonl file: one {\"context\": ..., "
                                             "\"continuation\": ...} a line.")],
    output: Annotated[Path | None, typer.Option(help="Write the scores here, one JSON line "
                                                "a request (default: print them).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --output.")] = False,
    batch_size: Annotated[int, typer.Option(help="Requests scored at once.")] = 8,
    quantize: Annotated[Literal[MODES], typer.Option(
        help="Run the decoder with int8 weights (its projections; the embedding stays "
             "float): about a quarter of the weight memory.")] = "none",
) -> None:
    """Score each continuation after its context with the latest checkpoint in --job-dir (or
    the one of --restore-checkpoint-step): its log-likelihood (natural log, summed over its
    tokens), its token count, whether greedy decoding gives it, and whether its context was cut
    on the left to fit the model. --quantize int8 scores with int8 projection weights
    (``pax_lm.quantization``)."""
    import jax

    from pax_lm.scoring import Scorer, encode_pair

    require_files([requests], "requests")
    if output is not None:
        check_output(output, overwrite)
    texts = read_requests(requests)
    restored, tokenizer, decoder, variables = restore_lm(job, quantize)
    pairs = [encode_pair(tokenizer, c, x) for c, x in texts.values()]
    for line, (_, continuation) in zip(texts, pairs, strict=True):
        if not continuation:
            raise UsageError(f"{requests}:{line}: the continuation has no tokens of its own "
                             f"(the tokenizer merged it into the context)")
        if len(continuation) > decoder.max_seq_len:
            raise UsageError(f"{requests}:{line}: the continuation is {len(continuation)} "
                             f"tokens; this model scores at most {decoder.max_seq_len} at once")
    scores = Scorer(decoder, variables, batch_size).score(pairs)
    lines = [json.dumps({"context": c, "continuation": x, "log_likelihood": s.log_likelihood,
                         "tokens": s.num_tokens, "is_greedy": s.is_greedy,
                         "truncated": s.truncated})
             for (c, x), s in zip(texts.values(), scores, strict=True)]
    if output is not None:
        with written_whole(output, jax.process_index() == 0) as f:
            if f is not None:
                f.write("".join(line + "\n" for line in lines))
        restored.echo(f"scored {len(lines)} requests into {output}")
    elif jax.process_index() == 0:  # bare JSON lines, for a pipe
        typer.echo("\n".join(lines))


def read_requests(path: Path) -> dict[int, tuple[str, str]]:
    """The (context, continuation) of each line of ``path``, by line number; a bad line is one
    usage error naming it."""
    from pax_lm.corpus import jsonl_records

    found = {}
    for line, record in jsonl_records(path):
        if not isinstance(record, dict) or set(record) != set(FIELDS) or not all(
                isinstance(record[k], str) for k in FIELDS):
            raise UsageError(f"{path}:{line}: each line is {{\"context\": text, "
                             f"\"continuation\": text}}, got {json.dumps(record)[:120]}")
        if not record["continuation"]:
            raise UsageError(f"{path}:{line}: the continuation is empty; there is nothing to "
                             f"score")
        found[line] = (record["context"], record["continuation"])
    if not found:
        raise UsageError(f"{path} holds no requests")
    return found
