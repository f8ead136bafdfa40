"""Supervised fine-tuning batches: conversations, loss only on the assistant's tokens.

``ChatInput`` reads the conversations of one split (``pax_lm.sft.conversations``), writes each
with a chat template (``pax_lm.sft.templates``) as tokens with the assistant's marked, and lays
them out as rows of ``seq_len`` predictions as ``TextInput`` lays out documents (its base,
``RowsInput``, does the rest: building on first use, refusing a split too small for a batch,
padding a finite input's last batch with weight-0 rows, order, position and processes). The
batch has ``LmInput``'s keys; ``weights`` is 1 exactly where the label is a token of an
assistant's answer (its text and the template's end-of-turn marker), 0 on system, user and
template text and on padding.

Conversations are packed first-fit into rows, each a segment of its own, so no conversation
attends to another. A conversation longer than a row is cut into pieces of a row each (as
``TextInput`` cuts documents) rather than truncated: truncating would drop the answers at its
end, often the only tokens it trains, where a piece that starts mid-conversation still trains
every answer token once, with the context the row holds. Keep ``seq_len`` above the longest
conversations to give every answer its whole prompt.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from pax_core import UsageError
from pax_lm.inputs.text import RowsInput, lay_out_rows
from pax_lm.sft.conversations import read_conversations, split_conversations
from pax_lm.sft.templates import chat_template


@dataclasses.dataclass
class TemplatedInput(RowsInput):
    """Rows of ``MATERIAL`` read from ``path`` (a ``.jsonl`` file or a folder of them) and
    written with ``chat_template`` (None: the tokenizer's own, else the plain one; ``"plain"``;
    or a ``.jinja`` file): the base of the fine-tuning inputs (``ChatInput``, pax-lm's DPO
    ``PreferenceInput``)."""

    path: str | None = None
    chat_template: str | None = None

    def _check_fields(self) -> None:
        super()._check_fields()
        if not isinstance(self.path, str) or not self.path:
            raise UsageError(f"input '{self.name}': path must name a .jsonl file of "
                             f"{self.MATERIAL} or a folder of them, got {self.path!r}")
        if self.chat_template is not None and not isinstance(self.chat_template, str):
            raise UsageError(f"input '{self.name}': chat_template must be None (the "
                             f"tokenizer's own), 'plain' or a .jinja file, got "
                             f"{self.chat_template!r}")

    def _source(self) -> str:
        return str(self.path)


@dataclasses.dataclass
class ChatInput(TemplatedInput):
    """Fine-tuning batches from the conversations in ``path`` (a ``.jsonl`` file or a folder of
    them), written with ``chat_template`` (None: the tokenizer's own, else the plain one;
    ``"plain"``; or a ``.jinja`` file).

    ``split="eval"`` holds out ``eval_fraction`` of the conversations (at least one), chosen by
    a hash of each; ``"train"`` is the rest.
    """

    CHANGED: ClassVar[str] = ("the conversations, chat template, tokenizer, split, seed, "
                              "batch_size, seq_len, packing, shuffle or repeat")
    MATERIAL: ClassVar[str] = "conversations"

    def _split_rows(self) -> dict[str, np.ndarray]:
        conversations = read_conversations(self.path)
        template = chat_template(self.tokenizer, self.chat_template)
        if self.eval_fraction > 0:
            conversations = split_conversations(conversations, self.split, self.eval_fraction,
                                                self._source())
        sequences = template.encode(conversations, self.tokenizer)
        lengths = np.array([len(tokens) for tokens, _ in sequences], np.int64)
        stream = np.concatenate([tokens for tokens, _ in sequences])
        trained = np.concatenate([flags for _, flags in sequences])
        return lay_out_rows(stream, lengths, self.tokenizer, self.seq_len, self.packing,
                            trained)
