"""The experiment mixin for preference tuning: preference pairs as an LM experiment's data, and
the DPO loss as its model."""

from __future__ import annotations

import fiddle as fdl

from pax_core import Train, UsageError
from pax_lm.dpo.model import REFERENCE_RULE, REFERENCE_WEIGHTS, DpoLanguageModel
from pax_lm.dpo.preference_input import PreferenceInput
from pax_lm.sft.dataset import SftDataset
from pax_transformer import ADAPTER_WEIGHTS


class DpoDataset(SftDataset):
    """Mixin for any pax-lm LM experiment: with ``DPO_DATA`` (a ``.jsonl`` file of preference
    pairs or a folder of them), tune the experiment's weights, or its adapters when
    ``LORA_RANK`` > 0, with DPO at strength ``DPO_BETA`` against the model it starts from (a
    warm start's source, an imported model): the model is ``DpoLanguageModel`` over the
    experiment's decoder, holding a frozen copy of the weights that train; the data the pairs
    written with ``CHAT_TEMPLATE`` through ``TOKENIZER`` (``SftDataset``'s) in rows of
    ``MAX_SEQ_LEN``. ``DPO_EVAL_FRACTION`` of the prompts are held out and evaluated on
    (``EVAL_BATCHES`` batches); 0 holds none out. Without ``DPO_DATA`` it is ``SftDataset``.
    """

    DPO_DATA: str | None = None
    DPO_BETA = 0.1
    DPO_EVAL_FRACTION = 0.02

    def datasets(self) -> list[fdl.Config]:
        if self.DPO_DATA is None:
            return super().datasets()
        if self.SFT_DATA is not None:
            raise UsageError("give DPO_DATA (preference pairs) or SFT_DATA (conversations), "
                             "not both")
        return self.preference_datasets()

    def model(self) -> fdl.Config:
        """DPO over the experiment's decoder with ``DPO_DATA``, else the experiment's model."""
        if self.DPO_DATA is None:
            return super().model()
        return self.quantized_training(fdl.Config(
            DpoLanguageModel, decoder=self.decoder(), beta=self.DPO_BETA,
            copied=ADAPTER_WEIGHTS if self.LORA_RANK else ".*"))

    def train(self) -> fdl.Config[Train]:
        """The experiment's, with DPO_DATA: the reference frozen, and filled by a warm start
        from the source's decoder."""
        train = super().train()
        if self.DPO_DATA is not None:
            train.learner.bprop_variable_exclusion = (
                *train.learner.bprop_variable_exclusion, REFERENCE_WEIGHTS)
            train.init_from_rules = (REFERENCE_RULE, *train.init_from_rules)
        return train

    def preference_datasets(self) -> list[fdl.Config[PreferenceInput]]:
        """The training input and, unless ``DPO_EVAL_FRACTION`` is 0, the held-out one."""
        common = dict(path=self.DPO_DATA, chat_template=self.CHAT_TEMPLATE,
                      tokenizer=self.tokenizer(), seq_len=self.MAX_SEQ_LEN,
                      batch_size=self.global_batch_size(), eval_fraction=self.DPO_EVAL_FRACTION)
        train = fdl.Config(PreferenceInput, name="train", split="train", is_training=True,
                           seed=1234, **common)
        if self.DPO_EVAL_FRACTION == 0:
            return [train]
        return [train, fdl.Config(PreferenceInput, name="heldout", split="eval",
                                  is_training=False, seed=4321,
                                  eval_num_batches=self.EVAL_BATCHES, **common)]
