"""Tiny random-weight models of every open family, built and saved by transformers itself, with
a small tokenizer: the sources the interchange tests import."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers

VOCAB = 96
SPECIALS = ["<pad>", "<s>", "</s>"]
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=3,
               num_attention_heads=4, max_position_embeddings=256)

# family -> (config class, its settings): each exercises what the family adds.
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", dict(_COMMON, num_key_value_heads=2, rms_norm_eps=1e-5,
                                  rope_theta=5000.0, tie_word_embeddings=False)),
    "llama3": ("LlamaConfig", dict(
        _COMMON, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "mistral": ("MistralConfig", dict(_COMMON, num_key_value_heads=2, sliding_window=5)),
    "qwen2": ("Qwen2Config", dict(_COMMON, num_key_value_heads=2, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(_COMMON, num_key_value_heads=2, head_dim=32)),
    "gemma": ("GemmaConfig", dict(_COMMON, num_key_value_heads=1, head_dim=16,
                                  hidden_activation="gelu_pytorch_tanh")),
    "gemma2": ("Gemma2Config", dict(_COMMON, num_key_value_heads=2, head_dim=16,
                                    query_pre_attn_scalar=24, sliding_window=4,
                                    attn_logit_softcapping=20.0,
                                    final_logit_softcapping=15.0)),
    "gemma3": ("Gemma3TextConfig", dict(
        _COMMON, num_hidden_layers=7, num_key_value_heads=2, head_dim=16,
        query_pre_attn_scalar=16, sliding_window=4, rope_theta=1e6,
        rope_local_base_freq=1e4, rope_scaling={"rope_type": "linear", "factor": 8.0})),
    "gpt2": ("GPT2Config", dict(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4,
                                n_positions=128)),
    "gpt_neox": ("GPTNeoXConfig", dict(_COMMON, rotary_pct=0.25, tie_word_embeddings=False)),
    "phi": ("PhiConfig", dict(_COMMON, partial_rotary_factor=0.5)),
    "mixtral": ("MixtralConfig", dict(_COMMON, num_key_value_heads=2, num_local_experts=4,
                                      num_experts_per_tok=2, router_aux_loss_coef=0.02)),
}


def write_tokenizer(folder: Path) -> None:
    """A word-level tokenizer of ``VOCAB - 8`` tokens (the model's embedding keeps spare rows,
    as published models pad theirs)."""
    import tokenizers

    words = SPECIALS + [f"w{i}" for i in range(VOCAB - 8 - len(SPECIALS))]
    model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<pad>")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(SPECIALS)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"}))


def save_family(name: str, folder: Path, dtype: torch.dtype = torch.float32,
                seed: int = 0) -> torch.nn.Module:
    """Build the family's tiny model with random weights (norm scales and biases too, so that
    a wrong mapping shows), save it with its tokenizer into ``folder``; returns it (float32,
    in eval mode)."""
    config_class, settings = CONFIGS[name]
    config = getattr(transformers, config_class)(**settings, bos_token_id=1, eos_token_id=2,
                                                 pad_token_id=0)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for tensor in model.parameters():
            tensor.normal_(0.0, 0.2 if tensor.ndim > 1 else 0.5)
    model.eval()
    folder.mkdir(parents=True)
    model.to(dtype).save_pretrained(folder, safe_serialization=True)
    write_tokenizer(folder)
    return model.to(torch.float32)
