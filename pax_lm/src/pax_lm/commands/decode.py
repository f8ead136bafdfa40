"""``pax decode``: sample text from the latest checkpoint of a language-model job."""

from __future__ import annotations

from typing import Annotated

import typer

from pax_core import (
    JobDirOpt,
    PlatformOpt,
    PluginOpt,
    RecordedExpOpt,
    RestoreStepOpt,
    SetOpt,
    UsageError,
)


def decode(
    ctx: typer.Context,
    job_dir: JobDirOpt,
    prompt: Annotated[str, typer.Option("--prompt", help="Text to continue.")],
    plugin: PluginOpt = None,
    exp: RecordedExpOpt = None,
    set_items: SetOpt = None,
    max_decode_steps: Annotated[int, typer.Option(help="Most tokens to generate.")] = 128,
    temperature: Annotated[float, typer.Option(help="0 is greedy; higher is more random.")] = 0.0,
    top_k: Annotated[int, typer.Option(help="Sample from the k likeliest tokens (0: all).")] = 0,
    top_p: Annotated[float, typer.Option(help="Sample from the smallest set of tokens "
                                         "holding this much probability.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed for sampling.")] = 0,
    platform: PlatformOpt = None,
    restore_step: RestoreStepOpt = None,
) -> None:
    """Continue a prompt with the latest checkpoint in --job-dir, or the one of
    --restore-checkpoint-step (KV-cached decoding)."""
    from pax_core import restore_latest
    from pax_lm.decoding import SamplingSettings, generate

    settings = SamplingSettings(max_decode_steps, temperature, top_k, top_p, seed)
    run, state, step = restore_latest(ctx.obj, exp=exp, plugin=plugin, set_items=set_items or [],
                                      job_dir=job_dir, platform=platform, step=restore_step)
    tokenizer = getattr(run.train_input, "tokenizer", None)
    decoder = getattr(run.task.model, "decoder", None)
    if tokenizer is None or decoder is None:
        raise UsageError(f"experiment {run.resolved.name} is not a text language model (it needs "
                         f"a decoder and an input with a tokenizer)")
    # Training saw every document as [bos, text, eos]: a prompt starts a document the same way.
    prompt_ids = [tokenizer.bos_id, *tokenizer.encode(prompt)]
    variables = {name: collection["decoder"] for name, collection
                 in run.eval_variables(state).items() if "decoder" in collection}
    tokens = generate(decoder, variables, prompt_ids, settings, eos_id=tokenizer.eos_id)
    import jax

    if jax.process_index() != 0:  # every process decodes the same tokens: print them once
        return
    typer.echo(f"[step {step}] {prompt}{tokenizer.decode(tokens)}")
    if len(prompt_ids) + len(tokens) >= decoder.max_seq_len:
        typer.echo(f"(stopped at the model's maximum length, {decoder.max_seq_len} tokens)",
                   err=True)


app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
app.command()(decode)
