"""``pax decode``: sample text from the latest checkpoint of a language-model job."""

from __future__ import annotations

from typing import Annotated

import typer

from pax_core import JobRequest, UsageError, job_command


@job_command
def decode(
    job: JobRequest,
    prompt: Annotated[str, typer.Option("--prompt", help="Text to continue.")],
    max_decode_steps: Annotated[int, typer.Option(help="Most tokens to generate.")] = 128,
    temperature: Annotated[float, typer.Option(help="0 is greedy; higher is more random.")] = 0.0,
    top_k: Annotated[int, typer.Option(help="Sample from the k likeliest tokens (0: all).")] = 0,
    top_p: Annotated[float, typer.Option(help="Sample from the smallest set of tokens "
                                         "holding this much probability.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed for sampling.")] = 0,
) -> None:
    """Continue a prompt with the latest checkpoint in --job-dir, or the one of
    --restore-checkpoint-step (KV-cached decoding)."""
    import jax

    from pax_lm.decoding import SamplingSettings, generate
    from pax_lm.models import LanguageModel

    settings = SamplingSettings(max_decode_steps, temperature, top_k, top_p, seed)
    restored = job.restore(LanguageModel, "a language model")
    tokenizer = getattr(restored.run.train_input, "tokenizer", None)
    if tokenizer is None:
        raise UsageError(f"experiment {restored.run.resolved.name} is not a text language "
                         f"model (its input has no tokenizer)")
    decoder = restored.model.decoder
    # Training saw every document as [bos, text, eos]: a prompt starts a document the same way.
    prompt_ids = [tokenizer.bos_id, *tokenizer.encode(prompt)]
    variables = {name: collection["decoder"] for name, collection
                 in restored.variables().items() if "decoder" in collection}
    tokens = generate(decoder, variables, prompt_ids, settings, eos_id=tokenizer.eos_id)
    restored.echo(f"{prompt}{tokenizer.decode(tokens)}")
    if len(prompt_ids) + len(tokens) >= decoder.max_seq_len and jax.process_index() == 0:
        typer.echo(f"(stopped at the model's maximum length, {decoder.max_seq_len} tokens)",
                   err=True)

