"""Language modelling for Pax: the LM task, text inputs and tokenizers, decoding, and Pax's LM
experiment catalogue under Pax's names; ``load`` restores a job for decoding and scoring from
Python (``pax_lm.api``).

The names below are pax-lm's public face, for other packages and for users' own experiments;
each is imported on first use (PEP 562), so that ``pax plugins`` (which imports
``pax_lm.plugin``) never imports JAX.
"""

from __future__ import annotations

from pax_core import public_face

_EXPORTS = {
    "LanguageModel": "pax_lm.models",
    "TransformerLmExperiment": "pax_lm.experiments.base",
    "ExpertParallel": "pax_lm.experiments.base",
    "QuickStartLm": "pax_lm.experiments.quickstart",
    "TinyLmForTests": "pax_lm.experiments.quickstart",
    "TextInput": "pax_lm.inputs.text",
    "TokensInput": "pax_lm.inputs.tokens",
    "ChatInput": "pax_lm.sft.chat_input",
    "PreparedChatInput": "pax_lm.sft.prepared",
    "SftDataset": "pax_lm.sft.dataset",
    "PreferenceInput": "pax_lm.dpo.preference_input",
    "DpoLanguageModel": "pax_lm.dpo.model",
    "DpoDataset": "pax_lm.dpo.dataset",
    "SamplingSettings": "pax_lm.decoding",
    "Engine": "pax_lm.inference.engine",
    "Batcher": "pax_lm.inference.batching",
    "Request": "pax_lm.inference.batching",
    "Completion": "pax_lm.inference.batching",
    "BeamSearch": "pax_lm.inference.beam",
    "Hypothesis": "pax_lm.inference.beam",
    "beam_search": "pax_lm.inference.beam",
    "Scorer": "pax_lm.scoring",
    "Score": "pax_lm.scoring",
    "load": "pax_lm.api",
    "LmJob": "pax_lm.api",
    "Continuation": "pax_lm.api",
}
__all__ = sorted(_EXPORTS)
__getattr__ = public_face(__name__, _EXPORTS)
