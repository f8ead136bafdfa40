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
``pax_lm.inputs.text.split_documents`` chooses documents.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from pax_core import UsageError
from pax_lm.inputs.text import split_documents

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
    root = Path(path)
    if not root.exists():
        raise UsageError(f"no such file or folder: {root}; give a .jsonl file of conversations "
                         f"or a folder of them")
    if root.is_file():
        files = [root]
    else:
        files = sorted(p for p in root.rglob("*.jsonl") if p.is_file() and not any(
            part.startswith(".") for part in p.relative_to(root).parts))
        if not files:
            raise UsageError(f"no .jsonl files under {root}; give a .jsonl file of "
                             f"conversations or a folder of them")
    conversations = [c for file in files for c in file_conversations(file)]
    if not conversations:
        raise UsageError(f"no conversations in {root}; write one per line as {FORMS}")
    return conversations


def file_conversations(file: Path) -> list[Conversation]:
    """The conversations of one JSONL file, each line checked."""
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{file}: not UTF-8 text ({e.reason} at byte {e.start}); save it as "
                         f"UTF-8") from None
    except OSError as e:
        raise UsageError(f"cannot read {file}: {e.strerror or e}") from None
    conversations = []
    # Only a newline ends a line: JSON strings may hold other line separators (U+2028).
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            where = f"{file}:{number}"
            conversations.append(Conversation(_messages(_record(line, where), where), where))
    return conversations


def split_conversations(conversations: list[Conversation], split: str, eval_fraction: float,
                        source: str) -> list[Conversation]:
    """The conversations of ``split`` in file order: those whose turns
    ``split_documents`` holds out (``eval``) or keeps (``train``), equal ones on the same side."""
    chosen = set(split_documents([c.key for c in conversations], split, eval_fraction, source))
    return [c for c in conversations if c.key in chosen]


def _record(line: str, where: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise UsageError(f"{where}: not JSON ({e.msg} at column {e.colno}); write each "
                         f"conversation on one line as {FORMS}") from None
    if not isinstance(record, dict):
        raise UsageError(f"{where}: a JSON {_kind(record)}, not an object; write each "
                         f"conversation as {FORMS}")
    return record


def _messages(record: dict[str, Any], where: str) -> tuple[dict[str, str], ...]:
    if "messages" in record and ("prompt" in record or "response" in record):
        raise UsageError(f"{where}: has both 'messages' and 'prompt'/'response'; keep one form")
    if "messages" in record:
        return _turns(record["messages"], where)
    if "prompt" in record and "response" in record:
        return _prompt_response(record, where)
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
            raise UsageError(f"{where}: '{field}' is a JSON {_kind(value)}, not a string; give "
                             f"its text as a string")
        turns.append({"role": role, "content": value})
    if not turns[-1]["content"].strip():
        raise UsageError(f"{where}: the response is empty; give the assistant's answer or drop "
                         f"the line")
    return tuple(turns)


def _turns(messages: Any, where: str) -> tuple[dict[str, str], ...]:
    if not isinstance(messages, list):
        raise UsageError(f"{where}: 'messages' is a JSON {_kind(messages)}, not a list; give "
                         f"the turns as a list of {{\"role\": ..., \"content\": ...}}")
    if not messages:
        raise UsageError(f"{where}: the conversation has no messages; give its turns or drop "
                         f"the line")
    turns = []
    for number, message in enumerate(messages, 1):
        what = f"{where}: message {number}"
        if not isinstance(message, dict):
            raise UsageError(f"{what} is a JSON {_kind(message)}, not an object; write it as "
                             f'{{"role": ..., "content": ...}}')
        role = message.get("role")
        if role is None:
            raise UsageError(f"{what} has no 'role'; give it one of {', '.join(ROLES)}")
        if role not in ROLES:
            raise UsageError(f"{what} has role {role!r}; use one of {', '.join(ROLES)}")
        content = message.get("content")
        if not isinstance(content, str):
            got = "no 'content'" if content is None else f"content of JSON {_kind(content)}"
            raise UsageError(f"{what} ({role}) has {got}; give its text as a string")
        if role == "assistant" and not content.strip():
            raise UsageError(f"{what} (assistant) is empty; give the assistant's answer or "
                             f"drop the turn")
        turns.append({"role": role, "content": content})
    if not any(turn["role"] == "assistant" for turn in turns):
        raise UsageError(f"{where}: the conversation has no assistant turn, so nothing to train "
                         f"on; add the assistant's answer or drop the line")
    return tuple(turns)


def _kind(value: Any) -> str:
    """The JSON name of a parsed value's type."""
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
             int: "number", float: "number"}
    return names.get(type(value), type(value).__name__)
