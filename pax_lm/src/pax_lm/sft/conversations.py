"""Conversations to fine-tune on, read from JSON lines.

Each non-blank line of a ``.jsonl`` file is one conversation, in either of the two forms that
fine-tuning sets are usually shipped in:

* ``{"prompt": str, "response": str}``: a user turn then an assistant turn; an optional
  ``"system"`` string becomes a system turn before them.
* ``{"messages": [{"role": "system" | "user" | "assistant", "content": str}, ...]}``: any
  number of turns, in order.

A file is checked whole before anything trains, and every mistake is one ``UsageError`` naming
the file and line and what to do, since a bad line found hours into a run costs the run. Every
conversation must hold an assistant turn with text: a conversation without one has nothing to
train on, and an empty answer would teach the model to stop at once.

The held-out split is chosen by a hash of each conversation (``split_conversations``), as
``pax_lm.inputs.text.split_documents`` chooses documents. Preference pairs
(``pax_lm.dpo.pairs``) are read from JSONL the same way (``read_jsonl``) and their prompts'
turns checked alike (``parse_turns``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from pax_core import UsageError
from pax_lm.corpus import find_files, jsonl_records
from pax_lm.inputs.text import split_documents, text_hashes

T = TypeVar("T")
ROLES = ("system", "user", "assistant")
FORMS = '{"messages": [{"role": ..., "content": ...}, ...]} or {"prompt": ..., "response": ...}'


@dataclasses.dataclass(frozen=True)
class Conversation:
    """The turns of one conversation (``{"role", "content"}`` dicts, as chat templates take
    them) and where it was read (``file:line``, for messages)."""

    messages: tuple[dict[str, str], ...]
    where: str

    @property
    def key(self) -> str:
        """The conversation as one string: equal for equal turns wherever they were read."""
        return json.dumps([[m["role"], m["content"]] for m in self.messages], ensure_ascii=False)


def read_conversations(path: str | os.PathLike) -> list[Conversation]:
    """The conversations of ``path``: a ``.jsonl`` file, or a folder searched recursively for
    them (sorted by path; hidden files and folders skipped)."""
    return read_jsonl(path, _conversation, "conversation", FORMS)


def conversation_files(path: str | os.PathLike) -> list[Path]:
    """The files ``read_conversations`` reads, in its order."""
    return jsonl_files(path, "conversation")


def file_conversations(file: Path) -> Iterator[Conversation]:
    """The conversations of one file, streamed and checked as ``read_conversations`` checks
    them (``pax data prepare --chat`` reads sets too large for memory this way)."""
    return file_records(file, _conversation, "conversation", FORMS)


def no_records(root: str | os.PathLike, what: str, forms: str) -> UsageError:
    """The refusal of a source that holds no ``what``."""
    return UsageError(f"no {what}s in {Path(root)}; write one per line as {forms}")


def read_jsonl(path: str | os.PathLike, parse: Callable[[dict[str, Any], str], T], what: str,
               forms: str) -> list[T]:
    """The records of ``path`` (a ``.jsonl`` file, or a folder searched recursively for them,
    sorted by path, hidden files and folders skipped), each non-blank line a JSON object read
    by ``parse(record, "file:line")``. ``what`` names one record in messages (``"conversation"``)
    and ``forms`` shows how to write one."""
    records = [record for file in jsonl_files(path, what)
               for record in file_records(file, parse, what, forms)]
    if not records:
        raise no_records(path, what, forms)
    return records


def jsonl_files(path: str | os.PathLike, what: str) -> list[Path]:
    """``path`` itself when a file, else the ``.jsonl`` files under it, sorted by path."""
    root = Path(path)
    if not root.exists():
        raise UsageError(f"no such file or folder: {root}; give a .jsonl file of {what}s or a "
                         f"folder of them")
    return [root] if root.is_file() else find_files(root, (".jsonl",))


def file_records(file: Path, parse: Callable[[dict[str, Any], str], T], what: str,
                 forms: str) -> Iterator[T]:
    """The records of one file, streamed (see ``read_jsonl``)."""
    hint = f"; write each {what} on one line as {forms}"
    for number, record in jsonl_records(file, hint):
        where = f"{file}:{number}"
        if not isinstance(record, dict):
            raise UsageError(f"{where}: a JSON {json_kind(record)}, not an object; write "
                             f"each {what} as {forms}")
        yield parse(record, where)


def conversation_hashes(conversations: Sequence[Conversation]) -> np.ndarray:
    """The hash of each conversation's turns that places it in a split
    (``split_conversations``)."""
    return text_hashes([c.key for c in conversations])


def split_conversations(conversations: list[Conversation], split: str, eval_fraction: float,
                        source: str) -> list[Conversation]:
    """The conversations of ``split`` in file order: those whose turns
    ``split_documents`` holds out (``eval``) or keeps (``train``), equal ones on the same side."""
    chosen = set(split_documents([c.key for c in conversations], split, eval_fraction, source))
    return [c for c in conversations if c.key in chosen]


def _conversation(record: dict[str, Any], where: str) -> Conversation:
    if "messages" in record and ("prompt" in record or "response" in record):
        raise UsageError(f"{where}: has both 'messages' and 'prompt'/'response'; keep one form")
    if "messages" in record:
        return Conversation(parse_turns(record["messages"], where), where)
    if "prompt" in record and "response" in record:
        return Conversation(_prompt_response(record, where), where)
    fields = ", ".join(record) or "none"
    raise UsageError(f"{where}: neither form of conversation (fields: {fields}); write it as "
                     f"{FORMS}")


def _prompt_response(record: dict[str, Any], where: str) -> tuple[dict[str, str], ...]:
    turns = []
    for field, role in (("system", "system"), ("prompt", "user"), ("response", "assistant")):
        if field == "system" and record.get("system") is None:
            continue
        value = record[field]
        if not isinstance(value, str):
            raise UsageError(f"{where}: '{field}' is a JSON {json_kind(value)}, not a string; "
                             f"give its text as a string")
        turns.append({"role": role, "content": value})
    if not turns[-1]["content"].strip():
        raise UsageError(f"{where}: the response is empty; give the assistant's answer or drop "
                         f"the line")
    return tuple(turns)


def parse_turns(messages: Any, where: str, needs_answer: bool = True
                ) -> tuple[dict[str, str], ...]:
    """The checked turns of a ``"messages"`` list read at ``where``; with ``needs_answer``,
    at least one must be the assistant's (a conversation to fine-tune on)."""
    if not isinstance(messages, list):
        raise UsageError(f"{where}: 'messages' is a JSON {json_kind(messages)}, not a list; "
                         f"give the turns as a list of {{\"role\": ..., \"content\": ...}}")
    if not messages:
        raise UsageError(f"{where}: the conversation has no messages; give its turns or drop "
                         f"the line")
    turns = []
    for number, message in enumerate(messages, 1):
        what = f"{where}: message {number}"
        if not isinstance(message, dict):
            raise UsageError(f"{what} is a JSON {json_kind(message)}, not an object; write it "
                             f'as {{"role": ..., "content": ...}}')
        role = message.get("role")
        if role is None:
            raise UsageError(f"{what} has no 'role'; give it one of {', '.join(ROLES)}")
        if role not in ROLES:
            raise UsageError(f"{what} has role {role!r}; use one of {', '.join(ROLES)}")
        content = message.get("content")
        if not isinstance(content, str):
            got = "no 'content'" if content is None else f"content of JSON {json_kind(content)}"
            raise UsageError(f"{what} ({role}) has {got}; give its text as a string")
        if role == "assistant" and not content.strip():
            raise UsageError(f"{what} (assistant) is empty; give the assistant's answer or "
                             f"drop the turn")
        turns.append({"role": role, "content": content})
    if needs_answer and not any(turn["role"] == "assistant" for turn in turns):
        raise UsageError(f"{where}: the conversation has no assistant turn, so nothing to train "
                         f"on; add the assistant's answer or drop the line")
    return tuple(turns)


def json_kind(value: Any) -> str:
    """The JSON name of a parsed value's type."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
             int: "number", float: "number"}
    return names.get(type(value), type(value).__name__)
