"""The experiment mixin for supervised fine-tuning: conversations as an LM experiment's data."""

from __future__ import annotations

import dataclasses

import fiddle as fdl

from pax_core import UsageError
from pax_lm.sft.chat_input import ChatInput
from pax_lm.sft.prepared import PreparedChatInput, is_prepared
from pax_lm.tokenizers import tokenizer_from_path


class SftDataset:
    """Mixin for any pax-lm LM experiment: fine-tune on the conversations of ``SFT_DATA`` (a
    ``.jsonl`` file or a folder of them), written with ``CHAT_TEMPLATE`` (None: the tokenizer's
    own, else the plain one; ``"plain"``; or a ``.jinja`` file) through ``TOKENIZER``, in rows of
    ``MAX_SEQ_LEN``, the loss on the assistant's tokens only. ``SFT_EVAL_FRACTION`` of the
    conversations are held out and evaluated on (``EVAL_BATCHES`` batches); 0 holds none out.

    ``SFT_DATA`` may instead name a folder of conversations prepared with ``pax data prepare
    --chat`` (written with the same tokenizer and template): they are streamed rather than held
    in memory (``PreparedChatInput``), the training input by ``INPUT_WORKERS`` processes.
    """

    TOKENIZER = "bytes"
    SFT_DATA: str | None = None
    CHAT_TEMPLATE: str | None = None
    SFT_EVAL_FRACTION = 0.02
    EVAL_BATCHES = 4
    INPUT_WORKERS = 0

    def datasets(self) -> list[fdl.Config[ChatInput] | fdl.Config[PreparedChatInput]]:
        return self.chat_datasets()

    def tokenizer(self) -> fdl.Config:
        """The ``TOKENIZER`` as a config."""
        made = tokenizer_from_path(self.TOKENIZER)
        fields = {f.name: getattr(made, f.name) for f in dataclasses.fields(made)}
        return fdl.Config(type(made), **fields)

    def chat_datasets(self) -> list[fdl.Config[ChatInput] | fdl.Config[PreparedChatInput]]:
        """The training input and, unless ``SFT_EVAL_FRACTION`` is 0, the held-out one."""
        if self.SFT_DATA is None:
            raise UsageError("set SFT_DATA to a .jsonl file of conversations (or a folder of "
                             "them) to fine-tune on")
        common = dict(path=self.SFT_DATA, chat_template=self.CHAT_TEMPLATE,
                      tokenizer=self.tokenizer(), seq_len=self.MAX_SEQ_LEN,
                      batch_size=self.global_batch_size(), eval_fraction=self.SFT_EVAL_FRACTION)
        kind, workers = ChatInput, {}
        if is_prepared(self.SFT_DATA):
            kind, workers = PreparedChatInput, {"num_workers": self.INPUT_WORKERS}
        train = fdl.Config(kind, name="train", split="train", is_training=True, seed=1234,
                           **workers, **common)
        if self.SFT_EVAL_FRACTION == 0:
            return [train]
        return [train, fdl.Config(kind, name="heldout", split="eval", is_training=False,
                                  seed=4321, eval_num_batches=self.EVAL_BATCHES, **common)]
