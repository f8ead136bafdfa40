"""Entry point of pax-lm: registrations only, nothing heavy imported."""

from pax_core import Component, hookimpl
from pax_lm.experiments.catalogue import EXPERIMENTS

# The range of pax_core.API_VERSION this plugin is built for.
PAX_API = ">=1.0,<2"


@hookimpl
def pax_register_models():
    return [Component("language_model", "pax_lm.models:LanguageModel",
                      "next-token cross-entropy over a decoder, Pax's LM metrics")]


@hookimpl
def pax_register_inputs():
    return [Component("text", "pax_lm.inputs.text:TextInput",
                      "text files, JSONL or a folder, tokenized and packed")]


@hookimpl
def pax_register_commands():
    return [
        Component("decode", "pax_lm.commands.decode:app",
                  "continue a prompt from a trained LM job"),
        Component("tokenizer", "pax_lm.commands.tokenizer:app", "train a SentencePiece tokenizer"),
    ]


@hookimpl
def pax_register_experiments():
    return list(EXPERIMENTS)
