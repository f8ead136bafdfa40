"""Preference pairs to tune on, read from JSON lines.

Each non-blank line of a ``.jsonl`` file is one pair: a prompt and two answers to it, the one
preferred (``"chosen"``) and the other (``"rejected"``), each a string. The prompt takes either
of the forms conversations take (``pax_lm.sft.conversations``):

* ``{"prompt": str, "chosen": str, "rejected": str}``: a user turn answered; an optional
  ``"system"`` string becomes a system turn before it.
* ``{"messages": [{"role": ..., "content": ...}, ...], "chosen": str, "rejected": str}``: the
  earlier turns of a conversation (a system turn among them), the answers continuing it.

A pair is written as its prompt's turns plus an assistant turn of either answer, with the same
chat templates as fine-tuning on conversations, and only that last answer is trained. Every
mistake is one ``UsageError`` naming the file and line: a pair without both answers, an empty
answer, two identical answers (nothing to prefer), a prompt that ends with the assistant's turn
(the answers reply to the user), and any mistake in the turns as conversations report it.

The held-out split is chosen by a hash of each pair's prompt (``split_pairs``), so that pairs
answering the same prompt fall on the same side and evaluation never sees a trained prompt.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from pax_core import UsageError
from pax_lm.inputs.text import split_documents
from pax_lm.sft.conversations import Conversation, json_kind, parse_turns, read_jsonl

FORMS = ('{"prompt": ..., "chosen": ..., "rejected": ...} or '
         '{"messages": [{"role": ..., "content": ...}, ...], "chosen": ..., "rejected": ...}')
ANSWERS = ("chosen", "rejected")


@dataclasses.dataclass(frozen=True)
class PreferencePair:
    """A prompt's turns, the preferred and the other answer to it, and where the pair was read
    (``file:line``, for messages)."""

    prompt: tuple[dict[str, str], ...]
    chosen: str
    rejected: str
    where: str

    @property
    def key(self) -> str:
        """The prompt as one string: equal for equal turns wherever they were read."""
        return json.dumps([[m["role"], m["content"]] for m in self.prompt], ensure_ascii=False)

    def conversation(self, answer: str) -> Conversation:
        """The prompt answered by ``answer`` (the chosen or the rejected one)."""
        return Conversation((*self.prompt, {"role": "assistant", "content": answer}), self.where)


def read_pairs(path: str | os.PathLike) -> list[PreferencePair]:
    """The preference pairs of ``path``: a ``.jsonl`` file, or a folder searched recursively for
    them (sorted by path; hidden files and folders skipped)."""
    return read_jsonl(path, _pair, "preference pair", FORMS)


def split_pairs(pairs: list[PreferencePair], split: str, eval_fraction: float,
                source: str) -> list[PreferencePair]:
    """The pairs of ``split`` in file order: those whose prompts ``split_documents`` holds out
    (``eval``) or keeps (``train``), pairs of the same prompt on the same side."""
    chosen = set(split_documents([p.key for p in pairs], split, eval_fraction, source))
    return [p for p in pairs if p.key in chosen]


def _pair(record: dict[str, Any], where: str) -> PreferencePair:
    if "messages" in record and ("prompt" in record or "system" in record):
        raise UsageError(f"{where}: has both 'messages' and 'prompt'/'system'; keep one form "
                         f"(a system turn goes in 'messages')")
    if "messages" in record:
        prompt = parse_turns(record["messages"], where, needs_answer=False)
    elif "prompt" in record:
        prompt = tuple({"role": role, "content": _text(record, field, where)}
                       for field, role in (("system", "system"), ("prompt", "user"))
                       if field == "prompt" or record.get(field) is not None)
    else:
        fields = ", ".join(record) or "none"
        raise UsageError(f"{where}: no prompt (fields: {fields}); write the pair as {FORMS}")
    if prompt[-1]["role"] == "assistant":
        raise UsageError(f"{where}: the prompt ends with an assistant turn; end it with the "
                         f"user's turn that the chosen and rejected answers reply to")
    for field in ANSWERS:
        if field not in record:
            raise UsageError(f"{where}: no '{field}' answer; give both 'chosen' and 'rejected' "
                             f"or drop the line")
        if not _text(record, field, where).strip():
            raise UsageError(f"{where}: the '{field}' answer is empty; give its text or drop "
                             f"the line")
    if record["chosen"] == record["rejected"]:
        raise UsageError(f"{where}: 'chosen' and 'rejected' are the same answer, so there is "
                         f"nothing to prefer; correct one of them or drop the line")
    return PreferencePair(prompt, record["chosen"], record["rejected"], where)


def _text(record: dict[str, Any], field: str, where: str) -> str:
    value = record[field]
    if not isinstance(value, str):
        raise UsageError(f"{where}: '{field}' is a JSON {json_kind(value)}, not a string; give "
                         f"its text as a string")
    return value
