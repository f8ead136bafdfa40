"""Preference tuning (DPO, Rafailov et al. 2023): JSONL preference pairs (``pairs``), the input
that lays each pair out as a chosen and a rejected row (``preference_input``), the loss against
the base model without its adapters (``model``), and the experiment mixin (``dataset``)."""
