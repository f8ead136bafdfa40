"""The OpenAI API's request bodies as Pax reads them, and the responses it writes.

Bodies are parsed by pydantic models that forbid unknown fields, so a misspelt parameter is a
400 naming it rather than silently ignored. Fields OpenAI's clients send with neutral values
(``n``, ``presence_penalty``, ``frequency_penalty``, ``logprobs``, ``user``) are accepted at
those values; asking for more than Pax serves (``n`` above 1, a penalty, log-probabilities) is a
400 saying so. The defaults are OpenAI's: ``temperature`` 1, ``max_tokens`` 16 for completions
and the rest of the model's length for chat. ``top_k`` is an extension (0: every token), as
other open servers accept it.
"""

from __future__ import annotations

import json
import secrets
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from pax_core import UsageError
from pax_lm.decoding import SamplingSettings
from pax_lm.inference import Completion

COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    """What both endpoints take."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    user: str | None = None

    def settings(self, max_tokens: int, limit: int) -> SamplingSettings:
        """The request's ``SamplingSettings``, ``max_tokens`` when it asks for none; a
        ``UsageError`` (a 400) for a value out of range or a feature not served."""
        if self.n != 1:
            raise UsageError(f"n must be 1 (one choice a prompt), got {self.n}")
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                raise UsageError(f"{name} is not supported; leave it at 0")
        if self.max_tokens is not None and self.max_tokens > limit:
            raise UsageError(f"max_tokens must be at most {limit} on this server, got "
                             f"{self.max_tokens}")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingSettings(
            max_tokens=max_tokens if self.max_tokens is None else self.max_tokens,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_k=self.top_k or 0, top_p=1.0 if self.top_p is None else self.top_p,
            seed=secrets.randbits(32) if self.seed is None else self.seed, stop=tuple(stop))


class CompletionRequest(_Sampling):
    """``/v1/completions``: text to continue, or several (one choice each)."""

    prompt: str | list[str]
    echo: bool = False
    logprobs: None = Field(None, description="not served: use pax score")

    def prompts(self) -> list[str]:
        prompts = [self.prompt] if isinstance(self.prompt, str) else self.prompt
        if not prompts:
            raise UsageError("prompt is an empty list; give a text or a list of texts")
        if self.stream and len(prompts) > 1:
            raise UsageError("stream takes one prompt; send a request a prompt")
        return prompts


class TextPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None


class ChatRequest(_Sampling):
    """``/v1/chat/completions``: a conversation to answer."""

    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: Literal[False] | None = None

    def turns(self) -> list[dict[str, Any]]:
        """The messages as ``{"role", "content"}`` (text parts joined; OpenAI's ``developer``
        role is the system's), for ``parse_turns`` to check."""
        if self.max_completion_tokens is not None:
            if self.max_tokens is not None:
                raise UsageError("give max_tokens or max_completion_tokens, not both")
            self.max_tokens = self.max_completion_tokens
        turns = []
        for message in self.messages:
            content = message.content
            if isinstance(content, list):
                content = "".join(part.text for part in content)
            role = "system" if message.role == "developer" else message.role
            turns.append({"role": role, "content": content})
        return turns


def completion_response(kind: str, name: str, done: list[tuple[Completion, str, int]]
                        ) -> dict[str, Any]:
    """The whole response of a request: each ``(completion, text, prompt_tokens)`` a choice;
    ``kind`` ``text_completion`` or ``chat.completion``."""
    chat = kind == "chat.completion"
    choices = []
    for index, (completion, text, _) in enumerate(done):
        choice = {"index": index, "finish_reason": completion.finish_reason, "logprobs": None}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choices.append(choice)
    prompt_tokens = sum(p for _, _, p in done)
    completion_tokens = sum(len(c.tokens) for c, _, _ in done)
    return {**_header(kind, name), "choices": choices,
            "usage": usage(prompt_tokens, completion_tokens)}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class ChunkWriter:
    """The server-sent events of one streamed request, all under one id."""

    def __init__(self, chat: bool, name: str) -> None:
        self.chat = chat
        self.header = _header("chat.completion.chunk" if chat else "text_completion", name)

    def chunk(self, text: str | None = None, finish_reason: str | None = None,
              role: bool = False) -> str:
        """An event carrying ``text`` (or the assistant's role, first in a chat), or the end."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason,
                      "logprobs": None}
        else:
            choice = {"index": 0, "text": text or "", "finish_reason": finish_reason,
                      "logprobs": None}
        return self.event({**self.header, "choices": [choice]})

    def usage(self, prompt_tokens: int, completion_tokens: int) -> str:
        """The last event before ``[DONE]`` when ``stream_options.include_usage`` asks."""
        return self.event({**self.header, "choices": [],
                           "usage": usage(prompt_tokens, completion_tokens)})

    @staticmethod
    def event(payload: dict[str, Any]) -> str:
        return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _header(kind: str, name: str) -> dict[str, Any]:
    prefix = "chatcmpl" if kind.startswith("chat") else "cmpl"
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
            "model": name}


def error_body(message: str, kind: str, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object, which its clients raise as their exceptions with ``message``."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
