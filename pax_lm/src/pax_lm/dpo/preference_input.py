"""Preference-tuning batches: each example a pair of rows, the chosen and the rejected answer.

``PreferenceInput`` reads the pairs of one split (``pax_lm.dpo.pairs``), writes each as two
conversations, its prompt answered by either answer, with a chat template
(``pax_lm.sft.templates``: the tokenizer's own or the plain one, as fine-tuning on conversations
writes them), and lays every pair out as two rows of ``seq_len`` next-token predictions. Its
base, ``RowsInput``, does the rest: building on first use, refusing a split too small for a
batch, padding a finite input's last batch with weight-0 pairs, order, position and processes.

**The batch** is stacked by pair: ``ids``, ``labels`` and ``weights``, each ``[local batch, 2,
seq_len]``, row 0 of a pair its chosen answer and row 1 its rejected one; so batch ``k`` holds
whole pairs however it is sharded over the batch axis. ``weights`` is 1 exactly where the label
is a token of the answer (its text and the template's end-of-turn marker), 0 on the prompt, on
earlier assistant turns and on padding. Pairs are not packed: each row holds one sequence from
position 0, padded after it, so no ``segment_ids`` are needed.

**A pair longer than a row** loses the start of its prompt: the same number of tokens from the
left of both rows, as many as the longer one needs, so that both answers are scored after the
same context, and every answer token is kept. A pair whose answer alone does not fit beside one
token of prompt is refused (its line named), since a cut answer would no longer be the answer
the pair prefers; keep ``seq_len`` above the longest pairs to give every prompt whole.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import numpy as np

from pax_core import UsageError
from pax_lm.dpo.pairs import PreferencePair, read_pairs, split_pairs
from pax_lm.sft.chat_input import TemplatedInput
from pax_lm.sft.templates import chat_template

# The batch: [local batch, 2 (chosen, rejected), seq_len] each.
KEYS = ("ids", "labels", "weights")


@dataclasses.dataclass
class PreferenceInput(TemplatedInput):
    """Preference-tuning batches from the pairs in ``path`` (a ``.jsonl`` file or a folder of
    them), written with ``chat_template`` (None: the tokenizer's own, else the plain one;
    ``"plain"``; or a ``.jinja`` file). ``packing`` does not apply: a pair takes its own rows.

    ``split="eval"`` holds out ``eval_fraction`` of the prompts (at least one), chosen by a hash
    of each; ``"train"`` is the rest. ``num_rows`` counts pairs.
    """

    CHANGED: ClassVar[str] = ("the preference pairs, chat template, tokenizer, split, seed, "
                              "batch_size, seq_len, shuffle or repeat")
    MATERIAL: ClassVar[str] = "preference pairs"

    def abstract_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
        shape = (self.local_batch_size, 2, self.seq_len)
        return {k: jax.ShapeDtypeStruct(shape, np.float32 if k == "weights" else np.int32)
                for k in KEYS}

    def _split_rows(self) -> dict[str, np.ndarray]:
        pairs = read_pairs(self.path)
        template = chat_template(self.tokenizer, self.chat_template)
        if self.eval_fraction > 0:
            pairs = split_pairs(pairs, self.split, self.eval_fraction, self._source())
        conversations = [p.conversation(a) for p in pairs for a in (p.chosen, p.rejected)]
        sequences = template.encode(conversations, self.tokenizer, last_only=True)
        shape = (len(pairs), 2, self.seq_len)
        tokens = np.min_scalar_type(max(self.tokenizer.vocab_size, self.tokenizer.pad_id))
        rows = {"ids": np.full(shape, self.tokenizer.pad_id, tokens),
                "labels": np.full(shape, self.tokenizer.pad_id, tokens),
                "weights": np.zeros(shape, np.uint8)}
        for i, pair in enumerate(pairs):
            both = sequences[2 * i:2 * i + 2]
            cut = self._cut(pair, both)
            for side, (ids, trained) in enumerate(both):
                ids, trained = ids[cut:], trained[cut:]
                n = len(ids) - 1
                rows["ids"][i, side, :n] = ids[:-1]
                rows["labels"][i, side, :n] = ids[1:]
                rows["weights"][i, side, :n] = trained[1:]
        return rows

    def _cut(self, pair: PreferencePair, both: list[tuple[np.ndarray, np.ndarray]]) -> int:
        """How many tokens both rows of ``pair`` lose from the left for the longer to fit;
        refused where that would cut into its answer."""
        lengths = [len(ids) for ids, _ in both]
        cut = max(0, max(lengths) - (self.seq_len + 1))
        side = int(np.argmax(lengths))
        trained = both[side][1]
        if np.argmax(trained) <= cut:  # the answer's first token would not stay a label
            raise UsageError(
                f"{pair.where}: the {('chosen', 'rejected')[side]} answer takes "
                f"{int(trained.sum())} tokens, too many for rows of {self.seq_len} beside its "
                f"prompt; raise seq_len (MAX_SEQ_LEN) or shorten the answer")
        return cut

    def _padded_to_whole_batches(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        missing = -len(rows["ids"]) % self.batch_size
        return {k: np.pad(v, ((0, missing), (0, 0), (0, 0)),
                          constant_values=0 if k == "weights" else self.tokenizer.pad_id)
                for k, v in rows.items()}
