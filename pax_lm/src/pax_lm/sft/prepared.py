"""Fine-tuning batches streamed from conversations prepared with ``pax data prepare --chat``.

``ChatInput`` holds a whole set in memory; a prepared set (``pax_lm.data.shards``: each
conversation's tokens as its chat template wrote them, with its loss mask) is streamed instead by
``TokensInput``'s machinery: rows planned from the index alone, shuffled and packed by blocks,
each process reading the tokens of its own rows, worker processes, an exact resume. A prediction
weighs its label's loss-mask bit, so the loss falls on the assistant's tokens exactly as
``ChatInput``'s does; where the layouts coincide (no shuffling, one packing block of 1,024
conversations or fewer) the batches are ``ChatInput``'s for the same conversations.

The held-out split is ``ChatInput``'s: the preparation stores the hash of each conversation's
turns (``hashes.npy``, 8 bytes a conversation), and ``eval`` is the ``eval_fraction`` (at least
one) with the smallest hashes, with every conversation equal to one of them; ``train`` is the
rest. Choosing it reads those hashes only, never a token.

The dataset must have been written with the experiment's tokenizer and chat template (the one
``chat_template`` names for it): a model prompted in another format than it was tuned on
answers worse, so a mismatch is refused, as is a text dataset.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from pax_core import UsageError
from pax_lm.data import shards
from pax_lm.data.shards import PreparedDataset
from pax_lm.inputs.text import check_split, held_out
from pax_lm.inputs.tokens import TokensInput, TokenSource
from pax_lm.sft.templates import chat_template


def is_prepared(path: str | Path) -> bool:
    """Whether ``path`` is a prepared dataset's folder (or an unfinished one's), rather than
    conversations in JSON lines."""
    root = Path(path)
    return root.is_dir() and ((root / shards.METADATA).is_file()
                              or (root / shards.SHARDS).is_dir())


class ChatSplit:
    """One split of a prepared conversation dataset: its conversations numbered from 0, in
    dataset order. Picklable by path: input workers reopen the dataset and choose the split
    again from its hashes rather than receive the split's document numbers."""

    def __init__(self, data: PreparedDataset, split: str, eval_fraction: float):
        self.data, self.split, self.eval_fraction = data, split, eval_fraction
        self.members = self._members()  # chosen, or refused, before a run starts

    def __getstate__(self) -> dict[str, Any]:
        return {"data": self.data, "split": self.split, "eval_fraction": self.eval_fraction}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["data"], state["split"], state["eval_fraction"])

    def _members(self) -> np.ndarray | None:
        """The dataset's document numbers in this split (None: all of them)."""
        if self.eval_fraction == 0:
            return None
        hashes = np.asarray(self.data.hashes)
        if len(hashes) < 2:
            raise UsageError(f"{self.data.path} holds {len(hashes)} conversation(s); at least 2 "
                             f"are needed to hold one out for evaluation (set "
                             f"SFT_EVAL_FRACTION=0, or prepare more)")
        held = held_out(hashes, self.eval_fraction)
        chosen = np.flatnonzero(held if self.split == "eval" else ~held)
        if not len(chosen):
            raise UsageError(f"{self.data.path}: every conversation is held out for evaluation "
                             f"(they are all identical); give more varied conversations")
        return chosen

    @property
    def num_documents(self) -> int:
        return self.data.num_documents if self.members is None else len(self.members)

    @property
    def fingerprint(self) -> str:
        return json.dumps([self.data.fingerprint, self.split, self.eval_fraction])

    def _documents(self, documents: Any) -> np.ndarray:
        numbers = np.asarray(documents, np.int64)
        return numbers if self.members is None else self.members[numbers]

    def lengths(self, documents: np.ndarray) -> np.ndarray:
        return self.data.lengths(self._documents(documents))

    def tokens(self, documents: list[int]) -> list[np.ndarray]:
        return [ids for ids, _ in self.masked_tokens(documents)]

    def masked_tokens(self, documents: list[int]) -> list[tuple[np.ndarray, np.ndarray]]:
        return self.data.masked_tokens(self._documents(documents).tolist())


@dataclasses.dataclass
class PreparedChatInput(TokensInput):
    """Fine-tuning batches streamed from the conversations prepared in ``path`` (``pax data
    prepare --chat``): ``LmInput``'s keys, ``weights`` 1 exactly on the assistant's tokens.

    ``chat_template`` is the experiment's (None: the tokenizer's own, else the plain one;
    ``"plain"``; or a ``.jinja`` file): the dataset must have been written with it.
    ``split="eval"`` holds out ``eval_fraction`` of the conversations as ``ChatInput`` does
    (module docstring); ``"train"`` is the rest.
    """

    CHANGED: ClassVar[str] = ("the prepared conversations, split, seed, seq_len, packing, "
                              "shuffle or repeat")
    MASKED: ClassVar[bool] = True

    chat_template: str | None = None
    split: str = "train"
    eval_fraction: float = 0.02

    def _check_fields(self) -> None:
        super()._check_fields()
        where = f"input '{self.name}'"
        if self.mixture is not None:
            raise UsageError(f"{where}: prepared conversations are read from one path, not a "
                             f"mixture")
        if not isinstance(self.path, str) or not self.path:
            raise UsageError(f"{where}: path must name a folder of conversations prepared with "
                             f"pax data prepare --chat, got {self.path!r}")
        check_split(where, self.split, self.eval_fraction)

    def _open_datasets(self) -> list[TokenSource]:
        data = PreparedDataset.open(self.path, content=shards.CHAT)
        data.check_tokenizer(self.tokenizer.name, self.tokenizer.fingerprint)
        wanted = chat_template(self.tokenizer, self.chat_template).identity
        recorded = data.chat_template
        if recorded["fingerprint"] != wanted["fingerprint"]:
            again = ("without --chat-template (the tokenizer's own)"
                     if self.chat_template is None else
                     f"with --chat-template {self.chat_template}")
            raise UsageError(
                f"{data.path} was written with the chat template {recorded['name']} "
                f"({recorded['fingerprint']}), not the experiment's {wanted['name']} "
                f"({wanted['fingerprint']}); prepare it again {again}, or set CHAT_TEMPLATE to "
                f"the one it was written with")
        return [ChatSplit(data, self.split, self.eval_fraction)]
