"""``pax serve``: a language-model job behind an OpenAI-compatible HTTP API.

The job's latest checkpoint (or ``--restore-checkpoint-step``'s; an imported model is a job
too) is restored once; a decoding engine of ``--slots`` KV-cache rows compiles every program it
can need before the server listens, then requests join and leave the running batch as they come
(``pax_lm.serving``). The server binds 127.0.0.1 unless told otherwise, can require an API key,
queues at most ``--max-waiting`` requests beyond the slots (429 past that), and on SIGTERM or
Ctrl-C stops listening, answers 503 to requests on open connections, finishes the requests in
flight and exits.
"""

from __future__ import annotations

import os
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

import typer

from pax_core import JobRequest, UsageError, job_command
from pax_lm.quantization import MODES

LOOPBACK = "127.0.0.1"


@job_command
def serve(
    job: JobRequest,
    host: Annotated[str, typer.Option(help="Address to listen on (0.0.0.0: every interface; "
                                      "require an --api-key there).")] = LOOPBACK,
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free one).")] = 8000,
    slots: Annotated[int, typer.Option(help="Requests decoded at once (KV-cache rows).")] = 8,
    max_waiting: Annotated[int, typer.Option(help="Requests queued for a slot; more are "
                                             "answered 429.")] = 64,
    max_tokens: Annotated[int | None, typer.Option(
        "--max-tokens", help="The most new tokens a request may ask for (default: the "
        "model's maximum length).")] = None,
    model_name: Annotated[str | None, typer.Option(
        help="The name clients give as 'model' (default: the job directory's name).")] = None,
    api_key: Annotated[str | None, typer.Option(
        envvar="PAX_API_KEY", help="Require 'Authorization: Bearer KEY' on /v1 requests.")] = None,
    chat_template: Annotated[str | None, typer.Option(
        help="The chat template of /v1/chat/completions: 'plain' or a .jinja file (default: "
             "the experiment's CHAT_TEMPLATE, else the tokenizer's own).")] = None,
    quantize: Annotated[Literal[MODES], typer.Option(
        help="Decode with int8 projection weights (about a quarter of the weight "
             "memory).")] = "none",
) -> None:
    """Serve the latest checkpoint in --job-dir (or --restore-checkpoint-step's) with
    OpenAI's API: /v1/completions, /v1/chat/completions (streamed on request), /v1/models,
    and /health."""
    if slots < 1:
        raise UsageError(f"--slots must be >= 1, got {slots}")
    if max_waiting < 0:
        raise UsageError(f"--max-waiting must be >= 0, got {max_waiting}")
    if not 0 <= port <= 65535:
        raise UsageError(f"--port must be in [0, 65535], got {port}")
    if max_tokens is not None and max_tokens < 1:
        raise UsageError(f"--max-tokens must be >= 1, got {max_tokens}")
    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key is empty; give a key or leave the option out")
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as e:
        raise UsageError(f"pax serve needs FastAPI and uvicorn ({e.name} is not installed): "
                         f"pip install 'pax-lm[serve]'") from None
    from pax_lm.commands.lm_jobs import restore_lm
    from pax_lm.inference import Batcher, Engine
    from pax_lm.serving import DecodeService, ServedModel, create_app, warm_up
    from pax_lm.sft.templates import chat_template as template_for

    restored, tokenizer, decoder, variables = restore_lm(job, quantize)
    if max_tokens is not None and max_tokens >= decoder.max_seq_len:
        raise UsageError(f"--max-tokens must be below the model's maximum length, "
                         f"{decoder.max_seq_len}, got {max_tokens}")
    spec = chat_template or getattr(restored.run.train_input, "chat_template", None)
    template = template_for(tokenizer, spec)
    batcher = Batcher(Engine(decoder, variables, slots), tokenizer.decode)
    warm_up(batcher, tokenizer.bos_id)
    name = model_name or PurePosixPath(job.job_dir.rstrip("/")).name or "pax"
    model = ServedModel(name, tokenizer, template, decoder.max_seq_len,
                        max_tokens or decoder.max_seq_len - 1)
    service = DecodeService(batcher, max_waiting)
    if host != LOOPBACK and api_key is None:
        typer.echo(f"warning: serving on {host} without an API key: anyone who can reach it "
                   f"can use it (--api-key or PAX_API_KEY)", err=True)
    config = uvicorn.Config(create_app(model, service, api_key), host=host, port=port,
                            log_level=os.environ.get("PAX_SERVE_LOG_LEVEL", "warning"),
                            access_log=False)

    class Server(uvicorn.Server):
        """Says where it listens once it does; refuses new requests as soon as a signal
        asks it to stop."""

        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets)
            if self.started:
                bound = self.servers[0].sockets[0].getsockname()[1]
                restored.echo(f"serving {name!r} at http://{host}:{bound}/v1 ({slots} slots, "
                              f"{max_waiting} waiting at most; Ctrl-C or SIGTERM stops)")

        def handle_exit(self, sig: int, frame: Any) -> None:
            if not service.draining:
                service.drain()
                typer.echo(f"stopping: {service.in_flight} requests in flight will finish; new "
                           f"ones are refused", err=True)
            super().handle_exit(sig, frame)

    server = Server(config)
    try:
        server.run()
    finally:
        service.close()
    if not server.started:
        raise UsageError(f"could not listen on {host}:{port} (in use, or not an address of "
                         f"this machine); pick another --host or --port")
