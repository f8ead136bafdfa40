"""The HTTP face of a served model: OpenAI's ``/v1/completions``, ``/v1/chat/completions`` (both
streamed as server-sent events on request), ``/v1/models``, and ``/health``, as a FastAPI app.

Every mistake of a client is answered with OpenAI's error object and a 4xx, and the server goes
on: a body that is not JSON, a field unknown or out of range (400), a prompt longer than the
model (400), an unknown model name (404), a missing or wrong API key (401), a full queue (429,
with ``Retry-After``); while shutting down, new requests get 503. A client that goes away while
its answer streams has its decoding stopped and its slot freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hmac
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse

from pax_core import UsageError
from pax_lm.decoding import prompt_ids, until_eos
from pax_lm.inference import Request as DecodeRequest
from pax_lm.serving.protocol import (
    COMPLETIONS_MAX_TOKENS,
    ChatRequest,
    ChunkWriter,
    CompletionRequest,
    completion_response,
    error_body,
)
from pax_lm.serving.service import Busy, DecodeService, Delta, Done, ShuttingDown, Stream

RETRY_AFTER_S = 1


@dataclasses.dataclass(frozen=True)
class ServedModel:
    """What the server needs of a model besides its decoding service: its ``name`` (the
    ``model`` requests must give), ``tokenizer``, chat ``template`` (``pax_lm``'s
    ``ChatTemplate``), its maximum length, and the most new tokens a request may ask for."""

    name: str
    tokenizer: Any
    template: Any
    max_seq_len: int
    max_tokens_limit: int
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))


class ApiError(Exception):
    """A request the server answers with ``status`` and OpenAI's error object."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code
        self.headers = headers


def create_app(model: ServedModel, service: DecodeService, api_key: str | None = None
               ) -> FastAPI:
    """The app serving ``model`` through ``service``; with ``api_key``, every ``/v1`` request
    must carry ``Authorization: Bearer API_KEY``. The app's shutdown waits for the requests
    in the service to end and stops its thread."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(service.close)

    app = FastAPI(title=f"Pax: {model.name}", docs_url=None, redoc_url=None, lifespan=lifespan)

    def authorized(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(),
                                                                 api_key.encode()):
            raise ApiError(401, "a valid API key is required: send 'Authorization: Bearer KEY'",
                           code="invalid_api_key")

    @app.exception_handler(ApiError)
    async def api_error(_: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(error_body(e.message, e.kind, e.code), e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(_validation_message(e), "invalid_request_error"), 400)

    @app.get("/health")
    async def health() -> JSONResponse:
        if service.draining:
            return JSONResponse({"status": "shutting down"}, 503)
        return JSONResponse({"status": "ok", "in_flight": service.in_flight})

    @app.get("/v1/models", dependencies=[Depends(authorized)])
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [_model_card(model)]}

    @app.get("/v1/models/{name:path}", dependencies=[Depends(authorized)])
    async def model_card(name: str) -> dict[str, Any]:
        _check_model(model, name)
        return _model_card(model)

    @app.post("/v1/completions", dependencies=[Depends(authorized)], response_model=None)
    async def completions(body: CompletionRequest) -> dict[str, Any] | StreamingResponse:
        _check_model(model, body.model)
        prompts = _usage(body.prompts)
        settings = _usage(lambda: body.settings(COMPLETIONS_MAX_TOKENS, model.max_tokens_limit))
        requests = [_request(service, model, prompt_ids(model.tokenizer, p), settings)
                    for p in prompts]
        echo = prompts if body.echo else [""] * len(prompts)
        if body.stream:
            return _streamed(service, requests[0], ChunkWriter(False, model.name), body, echo[0])
        done = await _completions(service, requests)
        return completion_response("text_completion", model.name, [
            (c, e + c.text, len(r.prompt)) for c, e, r in zip(done, echo, requests, strict=True)])

    @app.post("/v1/chat/completions", dependencies=[Depends(authorized)], response_model=None)
    async def chat(body: ChatRequest) -> dict[str, Any] | StreamingResponse:
        from pax_lm.sft.conversations import Conversation, parse_turns

        _check_model(model, body.model)
        turns = _usage(lambda: parse_turns(body.turns(), "the request", needs_answer=False))
        prompt = _usage(lambda: model.template.prompt(Conversation(turns, "the request"),
                                                      model.tokenizer))
        room = max(model.max_seq_len - len(prompt), 1)
        settings = _usage(lambda: body.settings(min(room, model.max_tokens_limit),
                                                model.max_tokens_limit))
        request = _request(service, model, prompt, settings)
        if body.stream:
            return _streamed(service, request, ChunkWriter(True, model.name), body, "")
        [done] = await _completions(service, [request])
        return completion_response("chat.completion", model.name,
                                   [(done, done.text, len(prompt))])

    return app


def _usage(make: Any) -> Any:
    """``make()``, its ``UsageError`` a 400."""
    try:
        return make()
    except UsageError as e:
        raise ApiError(400, str(e)) from None


def _request(service: DecodeService, model: ServedModel, prompt: list[int], settings: Any
             ) -> DecodeRequest:
    """A decoding request that stops at eos; a prompt the model cannot continue is a 400."""
    try:
        service.batcher.engine.check_prompt(prompt)
    except UsageError as e:
        raise ApiError(400, f"{e} (the prompt as the model reads it, with its bos token or "
                            f"chat template)", code="context_length_exceeded") from None
    return DecodeRequest(prompt, until_eos(settings, model.tokenizer))


def _submit(service: DecodeService, request: DecodeRequest, stream: bool) -> Stream:
    try:
        return service.submit(request, stream)
    except Busy as e:
        raise ApiError(429, str(e), kind="server_busy", code="queue_full",
                       headers={"Retry-After": str(RETRY_AFTER_S)}) from None
    except ShuttingDown as e:
        raise ApiError(503, str(e), kind="server_shutting_down") from None


async def _completions(service: DecodeService, requests: list[DecodeRequest]) -> list[Any]:
    """Every request's completion, all submitted at once (or none: a refusal cancels those
    already in)."""
    streams: list[Stream] = []
    try:
        for request in requests:
            streams.append(_submit(service, request, stream=False))
        return [await s.completion() for s in streams]
    except BaseException:
        for s in streams:
            s.cancel()
        raise


def _streamed(service: DecodeService, request: DecodeRequest, writer: ChunkWriter,
              body: Any, echo: str) -> StreamingResponse:
    """The response that streams ``request``'s text as it settles, then its finish reason,
    usage (if asked) and ``[DONE]``; the request is submitted now, so a refusal is a status."""
    stream = _submit(service, request, stream=True)
    include_usage = body.stream_options is not None and body.stream_options.include_usage

    async def events() -> AsyncIterator[str]:
        ended = False
        try:
            if writer.chat:
                yield writer.chunk(role=True)
            if echo:
                yield writer.chunk(echo)
            while True:
                event = await stream.next()
                if isinstance(event, Delta):
                    yield writer.chunk(event.text)
                    continue
                ended = True
                if event.error is not None:
                    yield writer.event(error_body(f"decoding failed: {event.error}",
                                                  "server_error"))
                    return
                assert isinstance(event, Done)
                yield writer.chunk(finish_reason=event.completion.finish_reason)
                if include_usage:
                    yield writer.usage(len(request.prompt), len(event.completion.tokens))
                yield "data: [DONE]\n\n"
                return
        finally:
            if not ended:
                stream.cancel()

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


def _check_model(model: ServedModel, name: str) -> None:
    if name != model.name:
        raise ApiError(404, f"the model {name!r} is not served here; this server serves "
                            f"{model.name!r} (GET /v1/models)", code="model_not_found")


def _model_card(model: ServedModel) -> dict[str, Any]:
    return {"id": model.name, "object": "model", "created": model.created, "owned_by": "pax",
            "max_model_len": model.max_seq_len}


def _validation_message(e: RequestValidationError) -> str:
    """The first problem of a body, as one line naming the field (a field of several accepted
    types names each type's complaint)."""
    errors = e.errors()
    first = errors[0]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON"
    field = _field(first)
    if first.get("type") == "extra_forbidden":
        return f"unknown field {field!r}"
    if first.get("type") == "missing":
        return f"{field} is required"
    complaints = dict.fromkeys(error["msg"] for error in errors if _field(error) == field)
    return f"{field}: {' or '.join(complaints)}"


def _field(error: dict[str, Any]) -> str:
    """The dotted path of an error's field, without the body's root or the union members
    pydantic names (``str``, ``list[str]``)."""
    parts = [str(p) for p in error.get("loc", ())[1:]]
    while parts and (not parts[-1].isidentifier() or parts[-1] in _TYPE_TAGS):
        parts.pop()
    return ".".join(parts) or "the body"


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "function-after"}
