"""Conversations as tokens, with the tokens to train on marked: a model's own chat template, or a
plain one.

**A model's own template** is the Jinja template its Hugging Face tokenizer ships: a
``chat_template.jinja`` file beside ``tokenizer.json``, else ``tokenizer_config.json``'s
``chat_template`` (a string, or a list of ``{"name", "template"}`` of which ``default`` is
used). It is rendered as transformers' ``apply_chat_template`` renders it, so that a model
fine-tuned here sees the text it will be prompted with: a sandboxed, immutable Jinja
environment with ``trim_blocks``, ``lstrip_blocks`` and loop controls; a ``tojson`` filter that
keeps non-ASCII text and does not escape HTML; the globals ``raise_exception`` and
``strftime_now``; and the variables ``messages``, ``add_generation_prompt``, ``tools`` and
``documents`` (None) and the special tokens ``tokenizer_config.json`` names (``bos_token``,
``eos_token``, ...). One difference: ``strftime_now`` formats a fixed time (``RENDER_TIME``),
not the clock's, so that the rows, and with them a run's saved position, are the same on any
day.

The tokens to train on come from rendering progressively. For each assistant turn ``i``, the
text of ``messages[:i]`` with the generation prompt is what precedes the answer, and the text of
``messages[:i+1]`` without it, less that prefix, is the answer: its content and the template's
end-of-turn marker, which the model must learn to write so that it stops. Each rendering must
extend the previous one exactly; a template that rewrites earlier turns (one that drops past
reasoning, say) cannot mark a loss this way and is refused. The pieces are tokenized one by one
without bos or eos (the template writes those as text, and the tokenizer reads its special
tokens' text as their single ids), so a token never spans a prompt and an answer.

**The plain template**, for a tokenizer without one (bytes, SentencePiece, a ``tokenizer.json``
without a template), or chosen by name::

    [bos]<|system|>\\n{system}\\n<|user|>\\n{prompt}\\n<|assistant|>\\n{answer}[eos]<|user|>\\n...

where ``[bos]`` and ``[eos]`` are the tokenizer's ids and the headers are plain text. The answer
and its eos are trained; to prompt the model, end the prompt with ``<|assistant|>\\n`` and
decode until eos. Turns after a conversation's last assistant turn train nothing, and are left
out with either template.

To prompt a model with a conversation (a server's chat request), ``ChatTemplate.prompt`` gives
its turns and the opening of the assistant's next one, as the template writes them.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from pax_core import UsageError
from pax_lm.sft.conversations import Conversation
from pax_lm.tokenizers import HfTokenizer, Tokenizer

PLAIN = "plain"
TEMPLATE_FILE = "chat_template.jinja"
TOKENIZER_CONFIG = "tokenizer_config.json"
# tokenizer_config.json's special tokens, as transformers hands them to templates.
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token", "additional_special_tokens")

# What a template's strftime_now formats: a fixed time rather than the clock's, so that a
# template that dates its system prompt renders the same rows on every day, and a run resumed
# tomorrow reads the data it saved its position in (the data key covers the rows).
RENDER_TIME = datetime(2025, 1, 1)

# A piece of a conversation: text to tokenize or a token id, and whether to train on it.
Piece = tuple[str | int, bool]


class ChatTemplate(abc.ABC):
    """A conversation as pieces of text and ids, the assistant's marked for training."""

    @property
    @abc.abstractmethod
    def identity(self) -> dict[str, str]:
        """``name`` (as messages show it) and ``fingerprint`` (equal for templates that write
        equal text): what a prepared dataset records of the template it was written with."""

    @abc.abstractmethod
    def pieces(self, conversation: Conversation, last_only: bool = False) -> list[Piece]:
        """The conversation up to its last assistant turn, in order; with ``last_only`` only
        that last answer is marked for training (the answer a preference pair compares)."""

    @abc.abstractmethod
    def prompt_pieces(self, conversation: Conversation) -> list[str | int]:
        """Every turn of the conversation, then what opens the assistant's next turn: the text
        a model is prompted with to answer it."""

    def prompt(self, conversation: Conversation, tokenizer: Tokenizer) -> list[int]:
        """The tokens of ``prompt_pieces``, each text piece tokenized on its own as ``encode``
        tokenizes them."""
        pieces = self.prompt_pieces(conversation)
        encoded = iter(tokenizer.encode_batch([p for p in pieces if isinstance(p, str)]))
        return [i for p in pieces for i in ([p] if isinstance(p, int) else next(encoded))]

    def encode(self, conversations: Sequence[Conversation], tokenizer: Tokenizer,
               last_only: bool = False, num_threads: int | None = None
               ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each conversation's tokens (int32) and a flag per token (bool): train on it (with
        ``last_only``, on its last answer alone). The texts of all pieces are tokenized in one
        batch (``encode_batch``, with ``num_threads``), then reassembled."""
        pieces = [self.pieces(c, last_only) for c in conversations]
        texts = [p for ps in pieces for p, _ in ps if isinstance(p, str)]
        encoded = iter(tokenizer.encode_batch(texts, num_threads=num_threads))
        result = []
        for ps in pieces:
            ids = [np.array([p], np.int32) if isinstance(p, int) else next(encoded)
                   for p, _ in ps]
            trained = [np.full(len(i), train) for i, (_, train) in zip(ids, ps, strict=True)]
            result.append((np.concatenate(ids).astype(np.int32), np.concatenate(trained)))
        return result


@dataclasses.dataclass(frozen=True)
class PlainTemplate(ChatTemplate):
    """``<|role|>`` headers on their own line, bos first and eos after each answer (see the
    module's docstring)."""

    bos_id: int
    eos_id: int

    @property
    def identity(self) -> dict[str, str]:
        # bos and eos are the tokenizer's, whose own fingerprint a dataset records beside it
        return {"name": PLAIN, "fingerprint": PLAIN}

    def pieces(self, conversation: Conversation, last_only: bool = False) -> list[Piece]:
        pieces: list[Piece] = [(self.bos_id, False)]
        messages = _through_last_answer(conversation.messages)
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                train = not last_only or i == len(messages) - 1
                pieces += [("<|assistant|>\n", False), (message["content"], train),
                           (self.eos_id, train)]
            else:
                pieces.append((f"<|{message['role']}|>\n{message['content']}\n", False))
        return pieces

    def prompt_pieces(self, conversation: Conversation) -> list[str | int]:
        pieces: list[str | int] = [self.bos_id]
        for message in conversation.messages:
            if message["role"] == "assistant":
                pieces += ["<|assistant|>\n", message["content"], self.eos_id]
            else:
                pieces.append(f"<|{message['role']}|>\n{message['content']}\n")
        return [*pieces, "<|assistant|>\n"]


class _Refused(Exception):
    """The template's own ``raise_exception``."""


class JinjaTemplate(ChatTemplate):
    """A Hugging Face chat template (``source``, read from ``where``) rendered progressively."""

    def __init__(self, source: str, where: str, special_tokens: dict[str, Any]):
        import jinja2
        import jinja2.ext
        import jinja2.sandbox

        self.where = where
        self.special_tokens = special_tokens
        digest = hashlib.sha256(json.dumps([source, special_tokens], sort_keys=True).encode())
        self.fingerprint = digest.hexdigest()[:16]
        environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise_exception
        environment.globals["strftime_now"] = _strftime_now
        try:
            self.template = environment.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise UsageError(f"the chat template {where} does not compile: {_line(e.message)} "
                             f"(line {e.lineno}); fix it, or use the plain template") from None

    @property
    def identity(self) -> dict[str, str]:
        return {"name": self.where, "fingerprint": self.fingerprint}

    def render(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool,
               conversation: Conversation) -> str:
        """The template's text of ``messages``; its refusals and failures as one line naming
        the conversation and the template."""
        try:
            return self.template.render(
                messages=list(messages), add_generation_prompt=add_generation_prompt,
                tools=None, documents=None, **self.special_tokens)
        except _Refused as e:
            raise UsageError(f"{conversation.where}: the chat template {self.where} refuses "
                             f"the conversation: {_line(str(e))}") from None
        except Exception as e:  # a template is a program: any failure is its or the data's
            raise UsageError(f"{conversation.where}: the chat template {self.where} fails to "
                             f"render the conversation ({type(e).__name__}: {_line(str(e))}); "
                             f"fix the template or the conversation") from None

    def pieces(self, conversation: Conversation, last_only: bool = False) -> list[Piece]:
        messages = _through_last_answer(conversation.messages)
        pieces: list[Piece] = []
        rendered = ""
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            prefix = self.render(messages[:i], True, conversation)
            full = self.render(messages[:i + 1], False, conversation)
            if not prefix.startswith(rendered) or not full.startswith(prefix):
                raise UsageError(
                    f"{conversation.where}: the chat template {self.where} does not render "
                    f"progressively (the text up to assistant turn {i + 1} does not extend the "
                    f"text before it), so the answer's tokens cannot be marked; use the plain "
                    f"template or a .jinja file that renders earlier turns unchanged")
            if len(full) == len(prefix):
                raise UsageError(f"{conversation.where}: the chat template {self.where} writes "
                                 f"nothing for assistant turn {i + 1}; use a template that "
                                 f"writes the assistant's answers")
            train = not last_only or i == len(messages) - 1
            pieces += [(prefix[len(rendered):], False), (full[len(prefix):], train)]
            rendered = full
        return [(text, train) for text, train in pieces if text]

    def prompt_pieces(self, conversation: Conversation) -> list[str | int]:
        return [self.render(conversation.messages, True, conversation)]


def chat_template(tokenizer: Tokenizer, spec: str | None) -> ChatTemplate:
    """The template ``spec`` names for ``tokenizer``: None, the tokenizer's own (plain where it
    has none); ``"plain"``; or the path of a Jinja file (for a Hugging Face tokenizer, whose
    special tokens a template writes as text)."""
    plain = PlainTemplate(tokenizer.bos_id, tokenizer.eos_id)
    if spec == PLAIN:
        return plain
    if spec is not None:
        if not isinstance(tokenizer, HfTokenizer):
            raise UsageError(f"the chat template {spec} needs a Hugging Face tokenizer "
                             f"(tokenizer.json), which reads its special tokens from text; use "
                             f"the plain template with the tokenizer {tokenizer.name}")
        path = Path(spec)
        if not path.is_file():
            raise UsageError(f"chat template not found: {spec}; give a .jinja file, 'plain', or "
                             f"nothing for the tokenizer's own")
        return JinjaTemplate(_read(path), str(path), _special_tokens(tokenizer))
    if not isinstance(tokenizer, HfTokenizer):
        return plain
    folder = Path(tokenizer.json_path).parent
    if (folder / TEMPLATE_FILE).is_file():
        path = folder / TEMPLATE_FILE
        return JinjaTemplate(_read(path), str(path), _special_tokens(tokenizer))
    config = _tokenizer_config(tokenizer)
    source = config.get("chat_template")
    if source is None:
        return plain
    where = f"of {folder / TOKENIZER_CONFIG}"
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        if "default" not in named:
            raise UsageError(f"{folder / TOKENIZER_CONFIG} has no chat template named 'default' "
                             f"(has: {', '.join(map(str, named))}); give one as a .jinja file")
        source, where = named["default"], f"'default' {where}"
    if not isinstance(source, str):
        raise UsageError(f"{folder / TOKENIZER_CONFIG}: chat_template is not text; give the "
                         f"template as a .jinja file")
    return JinjaTemplate(source, where, _special_tokens(tokenizer))


def _through_last_answer(messages: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    return list(messages[:last + 1])


def _tokenizer_config(tokenizer: HfTokenizer) -> dict[str, Any]:
    path = Path(tokenizer.json_path).parent / TOKENIZER_CONFIG
    if not path.is_file():
        return {}
    try:
        config = json.loads(_read(path))
    except json.JSONDecodeError as e:
        raise UsageError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(config, dict):
        raise UsageError(f"{path}: not a JSON object")
    return config


def _special_tokens(tokenizer: HfTokenizer) -> dict[str, Any]:
    """The special tokens ``tokenizer_config.json`` beside the tokenizer names, as text (a
    token saved as an object keeps its text in ``content``)."""
    config = _tokenizer_config(tokenizer)

    def text(value: Any) -> Any:
        return value.get("content") if isinstance(value, dict) else value

    tokens = {}
    for name in SPECIAL_TOKENS:
        value = config.get(name)
        value = [text(v) for v in value] if isinstance(value, list) else text(value)
        if value is not None:
            tokens[name] = value
    return tokens


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters, which would change the text a model sees.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    raise _Refused(message)


def _strftime_now(format: str) -> str:
    return RENDER_TIME.strftime(format)


def _line(text: str) -> str:
    return " ".join(text.split())

