"""``pax decode``: continue text with the latest checkpoint of a language-model job.

``--prompt TEXT`` prints one continuation. ``--prompts FILE.jsonl --output FILE.jsonl``
streams every prompt of a file through the decoding engine's ``--batch-size`` slots
(continuous batching: a prompt takes the first slot that frees up) and writes one line per
prompt, in the input's order. Each input line is ``{"prompt": str}`` with, optionally, its own
``max_tokens``, ``temperature``, ``top_k``, ``top_p``, ``seed`` and ``stop`` (a list of
strings); the command's options give the rest. Each output line is ``{"prompt", "completion",
"tokens", "finish_reason"}``: the completion's text (cut before a stop string), how many
tokens were generated for it (eos not counted) and ``stop`` or ``length``.

``--beam-size K`` searches instead (``pax_lm.inference.beam``): each prompt in turn, its K beams
the rows of the search, and the best hypothesis is the completion, its ``score`` (the
log-probability over the length penalty of ``--length-norm-alpha``) added to the output line
(printed after it with ``--prompt``). The beam size and alpha are the command's, one compiled
step for every prompt; a line still sets its own ``max_tokens``. Beam search draws nothing and
ends at eos or ``max_tokens``, so sampling settings (``temperature`` > 0, ``top_k``, ``top_p``)
and stop strings are refused with it, on the command line or on a line. ``--quantize int8``
decodes with int8 projection weights (``pax_lm.quantization``), as ``pax score`` scores.

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
from typing import Annotated, Any, Literal

import typer

from pax_core import JobRequest, UsageError, job_command
from pax_lm.commands.lm_jobs import check_output, restore_lm, written_whole
from pax_lm.decoding import prompt_ids, until_eos
from pax_lm.quantization import MODES

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
        help="Prompts decoded at once (the engine's slots) with --prompts; beam search "
             "takes them one at a time.")] = 8,
    max_tokens: Annotated[int, typer.Option(
        "--max-tokens", "--max-decode-steps", help="Most tokens to generate.")] = 128,
    temperature: Annotated[float, typer.Option(help="0 is greedy; higher is more random.")] = 0.0,
    top_k: Annotated[int, typer.Option(help="Sample from the k likeliest tokens (0: all).")] = 0,
    top_p: Annotated[float, typer.Option(help="Sample from the smallest set of tokens "
                                         "holding this much probability.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed for sampling.")] = 0,
    stop: Annotated[list[str] | None, typer.Option(
        "--stop", help="Stop before this text (repeatable).")] = None,
    beam_size: Annotated[int | None, typer.Option(
        help="Search this many beams for the likeliest continuation instead of drawing one "
             "token at a time; the output gets its score.")] = None,
    length_norm_alpha: Annotated[float | None, typer.Option(
        help="With --beam-size: rank hypotheses by log-probability over ((5 + length) / 6) ** "
             "alpha, which favours longer ones as alpha grows (default 0: by "
             "log-probability).")] = None,
    quantize: Annotated[Literal[MODES], typer.Option(
        help="Run the decoder with int8 weights (its projections; the embedding stays "
             "float): about a quarter of the weight memory.")] = "none",
) -> None:
    """Continue --prompt, or every prompt of --prompts into --output, with the latest
    checkpoint in --job-dir or the one of --restore-checkpoint-step (KV-cached decoding):
    sampled or greedy, or by beam search with --beam-size."""
    from pax_lm.decoding import SamplingSettings

    if (prompt is None) == (prompts is None):
        raise UsageError("give --prompt TEXT or --prompts FILE.jsonl (one of them)")
    if (output is None) != (prompts is None):
        raise UsageError("--output FILE.jsonl goes with --prompts (and only with it): it is "
                         "where the completions are written")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be >= 1, got {batch_size}")
    defaults = SamplingSettings(max_tokens, temperature, top_k, top_p, seed, tuple(stop or ()))
    beam = _beam_options(beam_size, length_norm_alpha, defaults)
    if prompts is None:
        _continue_one(job, prompt, defaults, beam, quantize)
        return
    lines = read_prompts(prompts, defaults, searched=beam is not None)
    check_output(output, overwrite)
    _decode_file(job, prompts, lines, output, batch_size, beam, quantize)


def _not_searched(settings: Any) -> list[str]:
    """The settings beam search cannot honour: sampling (``temperature`` above 0, ``top_k``,
    ``top_p`` below 1) and ``stop`` strings (a search ends at eos or ``max_tokens``)."""
    return [name for name, used in (
        ("temperature", settings.temperature > 0), ("top_k", settings.top_k > 0),
        ("top_p", settings.top_p < 1), ("stop", bool(settings.stop))) if used]


def _beam_options(beam_size: int | None, alpha: float | None, defaults: Any
                  ) -> tuple[int, float] | None:
    """``(beam size, length_norm_alpha)`` for beam search, None to sample; refuses options
    that do not go together."""
    if beam_size is None:
        if alpha is not None:
            raise UsageError("--length-norm-alpha ranks beam search's hypotheses: give it with "
                             "--beam-size K")
        return None
    if beam_size < 1:
        raise UsageError(f"--beam-size must be >= 1, got {beam_size}")
    if drawn := _not_searched(defaults):
        options = ", ".join("--" + name.replace("_", "-") for name in drawn)
        raise UsageError(f"--beam-size searches for the likeliest continuation and draws "
                         f"nothing: leave out {options}, or decode without --beam-size")
    if alpha is not None and alpha < 0:
        raise UsageError(f"--length-norm-alpha must be >= 0, got {alpha}")
    return beam_size, alpha or 0.0


def read_prompts(path: Path, defaults: Any, searched: bool = False
                 ) -> list[tuple[int, str, Any]]:
    """Each line's number, prompt and ``SamplingSettings`` (``defaults`` with the line's own
    values); a line that is not JSON, not an object, lacks ``prompt``, has another key or a
    bad value, or one asking for what beam search cannot do when ``searched``, is a
    ``UsageError`` naming the file and line."""
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
        if searched and (drawn := _not_searched(settings)):
            raise UsageError(f"{where}: beam search (--beam-size) takes no {', '.join(drawn)}; "
                             f"remove it from the line, or decode without --beam-size")
        lines.append((number, record["prompt"], settings))
    if not lines:
        raise UsageError(f"--prompts {path} holds no prompts")
    return lines


def _searched(searcher: Any, ids: list[int], settings: Any, alpha: float, tokenizer: Any
              ) -> dict[str, Any]:
    """The best hypothesis of a beam search as an output line's fields (eos not in its text
    nor counted in its tokens)."""
    best = searcher.search(ids, settings.max_tokens, alpha, tokenizer.eos_id)[0]
    tokens = best.tokens[:-1] if best.finish_reason == "stop" else best.tokens
    return {"completion": tokenizer.decode(tokens), "tokens": len(tokens),
            "finish_reason": best.finish_reason, "score": best.score}


def _continue_one(job: JobRequest, prompt: str, settings: Any, beam: tuple[int, float] | None,
                  mode: str) -> None:
    """Print ``[step N] prompt + continuation`` (and after it a beam search's score)."""
    import jax

    from pax_lm.inference import Batcher, BeamSearch, Engine, Request

    restored, tokenizer, decoder, variables = restore_lm(job, mode)
    ids = prompt_ids(tokenizer, prompt)
    notes = []
    if beam is None:
        batcher = Batcher(Engine(decoder, variables, slots=1), tokenizer.decode)
        [done] = batcher.run([Request(ids, until_eos(settings, tokenizer))])
        text, tokens = done.text, len(done.tokens)
    else:
        found = _searched(BeamSearch(decoder, variables, beam[0]), ids, settings, beam[1],
                          tokenizer)
        text, tokens = found["completion"], found["tokens"]
        notes.append(f"(score {found['score']:.4f}, finish_reason {found['finish_reason']})")
    if len(ids) + tokens >= decoder.max_seq_len:
        notes.append(f"(stopped at the model's maximum length, {decoder.max_seq_len} tokens)")
    restored.echo(f"{prompt}{text}")
    if jax.process_index() == 0:
        for note in notes:
            typer.echo(note, err=True)


def _decode_file(job: JobRequest, path: Path, lines: list[tuple[int, str, Any]], output: Path,
                 batch_size: int, beam: tuple[int, float] | None, mode: str) -> None:
    """Every prompt of ``lines`` through ``batch_size`` slots, or beam search of each in turn,
    into ``output``."""
    import jax

    from pax_lm.inference import Batcher, BeamSearch, Engine, Request

    restored, tokenizer, decoder, variables = restore_lm(job, mode)
    runner = (Engine(decoder, variables, slots=batch_size) if beam is None
              else BeamSearch(decoder, variables, beam[0]))
    encoded = []
    for number, text, _ in lines:
        ids = prompt_ids(tokenizer, text)
        try:
            runner.check_prompt(ids)
        except UsageError as e:
            raise UsageError(f"{path}:{number}: {e} (the bos token included)") from None
        encoded.append(ids)
    if beam is None:
        batcher = Batcher(runner, tokenizer.decode)
        found = ({"completion": done.text, "tokens": len(done.tokens),
                  "finish_reason": done.finish_reason} for done in batcher.run(
            Request(ids, until_eos(settings, tokenizer))
            for ids, (_, _, settings) in zip(encoded, lines, strict=True)))
        how = f"{batch_size} at once"
    else:
        found = (_searched(runner, ids, settings, beam[1], tokenizer)
                 for ids, (_, _, settings) in zip(encoded, lines, strict=True))
        how = f"beams of {beam[0]}"
    start, generated = time.perf_counter(), 0
    with written_whole(output, jax.process_index() == 0) as f:
        for (_, text, _), fields in zip(lines, found, strict=True):
            generated += fields["tokens"]
            if f is not None:
                f.write(json.dumps({"prompt": text, **fields}, ensure_ascii=False) + "\n")
    seconds = time.perf_counter() - start
    restored.echo(f"{len(lines)} completions -> {output} ({generated} tokens in {seconds:.1f} s, "
                  f"{generated / seconds:.0f} tokens/s, {how})")
