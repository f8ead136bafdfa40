"""Entry point of pax-lm: registrations only, nothing heavy imported."""

from pax_core import Component, hookimpl
from pax_lm.experiments.catalogue import EXPERIMENTS

# The range of pax_core.API_VERSION this plugin is built for.
PAX_API = ">=1.16,<2"


@hookimpl
def pax_register_models():
    return [Component("language_model", "pax_lm.models:LanguageModel",
                      "next-token cross-entropy over a decoder, Pax's LM metrics")]


@hookimpl
def pax_register_inputs():
    return [Component("text", "pax_lm.inputs.text:TextInput",
                      "text files, JSONL or a folder, tokenized and packed"),
            Component("tokens", "pax_lm.inputs.tokens:TokensInput",
                      "prepared token datasets (pax data prepare) and mixtures of them, "
                      "streamed through grain")]


@hookimpl
def pax_register_commands():
    return [
        Component("decode", "pax_lm.commands.decode:decode",
                  "continue a prompt from a trained LM job"),
        Component("score", "pax_lm.commands.score:score",
                  "log-likelihoods of continuations given contexts, from a trained LM job"),
        Component("serve", "pax_lm.commands.serve:serve",
                  "serve a trained LM job with OpenAI's HTTP API (completions, chat)"),
        Component("tokenizer", "pax_lm.commands.tokenizer:app", "train a SentencePiece tokenizer"),
        Component("data", "pax_lm.commands.data:app",
                  "prepare token datasets (ArrayRecord shards) and inspect them"),
    ]


@hookimpl
def pax_register_experiments():
    return list(EXPERIMENTS)


@hookimpl
def pax_register_weight_formats():
    return [Component("hf", "pax_lm.hf.format:HfFormat",
                      "Hugging Face folders of decoder LMs: config.json, safetensors, tokenizer"),
            Component("peft", "pax_lm.hf.peft:PeftFormat",
                      "PEFT's LoRA adapter folders of a job's adapters (export only)"),
            Component("paxml", "pax_lm.paxml.format:PaxmlFormat",
                      "paxml checkpoints of Pax's LM catalogue (import only; needs --exp)")]


@hookimpl
def pax_register_harnesses():
    return [Component("lm-eval", "pax_lm.harness:evaluate",
                      "EleutherAI's lm-evaluation-harness tasks (pip install 'pax-lm[harness]')")]
