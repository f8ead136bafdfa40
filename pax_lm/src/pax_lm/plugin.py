"""Entry point of pax-lm: registrations only, nothing heavy imported."""

from pax_core import hookimpl
from pax_core.plugins.records import Component
from pax_lm.catalogue import EXPERIMENTS


@hookimpl
def pax_register_models():
    return [Component("language_model", "pax_lm.model:LanguageModel",
                      "next-token cross-entropy over a decoder, Pax's LM metrics")]


@hookimpl
def pax_register_inputs():
    return [Component("text", "pax_lm.text_input:TextInput",
                      "text files, JSONL or a folder, tokenized and packed")]


@hookimpl
def pax_register_commands():
    return [
        Component("decode", "pax_lm.decode_cli:app", "continue a prompt from a trained LM job"),
        Component("tokenizer", "pax_lm.tokenizer_cli:app", "train a SentencePiece tokenizer"),
    ]


@hookimpl
def pax_register_experiments():
    return list(EXPERIMENTS)
