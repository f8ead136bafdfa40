"""``pax decode``: continue text with the latest checkpoint of a language-model job.

``--prompt TEXT`` prints one continuation. ``--prompts FILE.jsonl --output FILE.jsonl``
streams every prompt of a file through the decoding engine's ``--batch-size`` slots
(continuous batching: a prompt takes the first slot that frees up) and writes one line per
prompt, in the input's order. Each input line is ``{"prompt": str}`` with, optionally, its own
``max_tokens``, ``temperature``, ``top_k``, ``top_p``, ``seed`` and ``stop`` (a list of
strings); the command's options give the rest. Each output line is ``{"prompt", "completion",
"tokens", "finish_reason"}``: the completion's text (cut before a stop string), how many
tokens were generated for it (eos not counted) and ``stop`` or ``length``.

The whole input is checked before the job is restored (its JSON, keys and values) and every
prompt's length right after (it needs the job's tokenizer), so a bad line costs no decoding;
the output appears whole or not at all, and replaces an existing file only with
``--overwrite`` (``pax_lm.commands.lm_jobs``).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from pax_core import JobRequest, UsageError, job_command
from pax_lm.commands.lm_jobs import check_output, restore_lm, written_whole

LINE_KEYS = ("prompt", "max_tokens", "temperature", "top_k", "top_p", "seed", "stop")


@job_command
def decode(
    job: JobRequest,
    prompt: Annotated[str | None, typer.Option("--prompt", help="Text to continue.")] = None,
    prompts: Annotated[Path | None, typer.Option(
        "--prompts", help="A JSONL file of prompts: a line is {\"prompt\": TEXT} and "
        "optionally max_tokens, temperature, top_k, top_p, seed, stop (a list of strings).",
    )] = None,
    output: Annotated[Path | None, typer.Option(
        "--output", help="The JSONL file of completions for --prompts: one line a prompt, in "
        "order.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --output.")] = False,
    batch_size: Annotated[int, typer.Option(
        help="Prompts decoded at once (the engine's slots) with --prompts.")] = 8,
    max_tokens: Annotated[int, typer.Option(
        "--max-tokens", "--max-decode-steps", help="Most tokens to generate.")] = 128,
    temperature: Annotated[float, typer.Option(help="0 is greedy; higher is more random.")] = 0.0,
    top_k: Annotated[int, typer.Option(help="Sample from the k likeliest tokens (0: all).")] = 0,
    top_p: Annotated[float, typer.Option(help="Sample from the smallest set of tokens "
                                         "holding this much probability.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed for sampling.")] = 0,
    stop: Annotated[list[str] | None, typer.Option(
        "--stop", help="Stop before this text (repeatable).")] = None,
) -> None:
    """Continue --prompt, or every prompt of --prompts into --output, with the latest
    checkpoint in --job-dir or the one of --restore-checkpoint-step (KV-cached decoding)."""
    from pax_lm.decoding import SamplingSettings

    if (prompt is None) == (prompts is None):
        raise UsageError("give --prompt TEXT or --prompts FILE.jsonl (one of them)")
    if (output is None) != (prompts is None):
        raise UsageError("--output FILE.jsonl goes with --prompts (and only with it): it is "
                         "where the completions are written")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
    defaults = SamplingSettings(max_tokens, temperature, top_k, top_p, seed, tuple(stop or ()))
    if prompts is None:
        _continue_one(job, prompt, defaults)
        return
    lines = read_prompts(prompts, defaults)
    check_output(output, overwrite)
    _decode_file(job, prompts, lines, output, batch_size)


def read_prompts(path: Path, defaults: Any) -> list[tuple[int, str, Any]]:
    """Each line's number, prompt and ``SamplingSettings`` (``defaults`` with the line's own
    values); a line that is not JSON, not an object, lacks ``prompt``, has another key or a
    bad value is a ``UsageError`` naming the file and line."""
    from pax_lm.corpus import jsonl_records

    if not path.is_file():
        raise UsageError(f"--prompts {path}: no such file")
    lines = []
    for number, record in jsonl_records(path):
        where = f"{path}:{number}"
        if not isinstance(record, dict):
            raise UsageError(f"{where}: expected a JSON object such as {{\"prompt\": \"...\"}}, "
                             f"got {type(record).__name__}")
        unknown = [key for key in record if key not in LINE_KEYS]
        if unknown:
            raise UsageError(f"{where}: unknown key {unknown[0]!r}; a line holds "
                             f"{', '.join(LINE_KEYS)}")
        if not isinstance(record.get("prompt"), str):
            got = type(record["prompt"]).__name__ if "prompt" in record else "nothing"
            raise UsageError(f"{where}: 'prompt' must be text, got {got}")
        own = {key: value for key, value in record.items() if key != "prompt"}
        if "stop" in own:
            if not isinstance(own["stop"], list):
                raise UsageError(f"{where}: 'stop' must be a list of strings, got "
                                 f"{type(own['stop']).__name__}")
            own["stop"] = tuple(own["stop"])
        try:
            settings = dataclasses.replace(defaults, **own)
        except UsageError as e:
            raise UsageError(f"{where}: {e}") from None
        lines.append((number, record["prompt"], settings))
    if not lines:
        raise UsageError(f"--prompts {path} holds no prompts")
    return lines


def _prompt_ids(tokenizer: Any, text: str) -> list[int]:
    # Training saw every document as [bos, text, eos]: a prompt starts a document the same way.
    return [tokenizer.bos_id, *tokenizer.encode(text)]


def _with_eos(settings: Any, tokenizer: Any) -> Any:
    return dataclasses.replace(settings, stop_ids=(*settings.stop_ids, tokenizer.eos_id))


def _continue_one(job: JobRequest, prompt: str, settings: Any) -> None:
    """Print ``[step N] prompt + continuation``."""
    import jax

    from pax_lm.inference import Batcher, Engine, Request

    restored, tokenizer, decoder, variables = restore_lm(job)
    ids = _prompt_ids(tokenizer, prompt)
    batcher = Batcher(Engine(decoder, variables, slots=1), tokenizer.decode)
    [done] = batcher.run([Request(ids, _with_eos(settings, tokenizer))])
    restored.echo(f"{prompt}{done.text}")
    if len(ids) + len(done.tokens) >= decoder.max_seq_len and jax.process_index() == 0:
        typer.echo(f"(stopped at the model's maximum length, {decoder.max_seq_len} tokens)",
                   err=True)


def _decode_file(job: JobRequest, path: Path, lines: list[tuple[int, str, Any]], output: Path,
                 batch_size: int) -> None:
    """Every prompt of ``lines`` through ``batch_size`` slots, into ``output``."""
    import jax

    from pax_lm.inference import Batcher, Engine, Request

    restored, tokenizer, decoder, variables = restore_lm(job)
    engine = Engine(decoder, variables, slots=batch_size)
    requests = []
    for number, text, settings in lines:
        ids = _prompt_ids(tokenizer, text)
        try:
            engine.check_prompt(ids)
        except UsageError as e:
            raise UsageError(f"{path}:{number}: {e} (the bos token included)") from None
        requests.append(Request(ids, _with_eos(settings, tokenizer)))
    batcher = Batcher(engine, tokenizer.decode)
    start, generated = time.perf_counter(), 0
    with written_whole(output, jax.process_index() == 0) as f:
        for (_, text, _), done in zip(lines, batcher.run(requests), strict=True):
            generated += len(done.tokens)
            if f is not None:
                f.write(json.dumps({"prompt": text, "completion": done.text,
                                    "tokens": len(done.tokens),
                                    "finish_reason": done.finish_reason},
                                   ensure_ascii=False) + "\n")
    seconds = time.perf_counter() - start
    restored.echo(f"{len(lines)} completions -> {output} ({generated} tokens in {seconds:.1f} s, "
                  f"{generated / seconds:.0f} tokens/s, {batch_size} at once)")
