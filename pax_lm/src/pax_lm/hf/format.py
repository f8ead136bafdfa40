"""The ``hf`` weight format: Hugging Face folders of decoder-only language models.

``pax import hf SRC --output JOB`` reads ``config.json`` into the constants of
``OpenWeightsLm`` (``families.py``), the tokenizer (``tokenizer.json``, else
``tokenizer.model``) into the job's assets, and the safetensors weights one tensor at a time
(``tensors.py``); ``pax export --format hf`` writes the same layout back (in the job's compute
dtype: bfloat16, or float32 exactly as trained): sharded safetensors,
``config.json``, ``generation_config.json`` and the tokenizer's files, which
``transformers.AutoModelForCausalLM.from_pretrained`` loads with no missing or unexpected keys.
A model's low-rank adapters are folded into its weights (``peft.py`` writes them apart).
Nothing here imports torch or transformers.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from pax_core import SourceModel, UsageError, WeightFormat
from pax_lm.hf import families, tensors
from pax_lm.hf.safetensors_files import list_tensors, read_tensor, write_tensors
from pax_transformer import merge_adapter

EXPERIMENT = "OpenWeightsLm"
# Tokenizer files a Hugging Face folder may hold, carried into a job and out of it again.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                   "special_tokens_map.json", "chat_template.jinja")


def _config(source: Path) -> dict[str, Any]:
    path = source / "config.json"
    if not source.is_dir():
        raise UsageError(f"{source} is not a folder; give a Hugging Face model folder (with "
                         f"config.json and safetensors weights)")
    if not path.exists():
        raise UsageError(f"{source} has no config.json; give a Hugging Face model folder")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"{path} does not read as JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise UsageError(f"{path} is not a JSON object")
    if cfg.get("text_config") and cfg.get("model_type") != "gemma3_text":
        raise UsageError(f"{path} describes a multimodal model ({cfg.get('model_type')}); Pax "
                         f"imports its text decoder only from a text-only folder")
    return cfg


def _dtype(cfg: dict[str, Any]) -> str:
    """The compute dtype a job of this checkpoint runs in: float32 for a float32 checkpoint,
    bfloat16 otherwise (as it was trained)."""
    return "float32" if cfg.get("torch_dtype", cfg.get("dtype")) == "float32" else "bfloat16"


class HfFormat(WeightFormat):
    """Hugging Face's ``config.json`` + safetensors + tokenizer folders."""

    def recognises(self, source: Path) -> bool:
        return (source / "config.json").exists() and any(
            (source / name).exists() for name in ("model.safetensors",
                                                  "model.safetensors.index.json"))

    def inspect(self, source: Path, assets: Path, exp: str | None, set_items: list[str]
                ) -> SourceModel:
        cfg = _config(source)
        family = families.family_of(cfg)
        constants = families.constants(cfg)
        constants["FPROP_DTYPE"] = _dtype(cfg)
        files = {name: source / name for name in TOKENIZER_FILES if (source / name).exists()}
        tokenizer = next((n for n in ("tokenizer.json", "tokenizer.model") if n in files), None)
        if tokenizer is None:
            raise UsageError(f"{source} has no tokenizer.json or tokenizer.model; a job needs "
                             f"the model's tokenizer")
        self._check_vocabulary(source / tokenizer, constants["VOCAB_SIZE"])
        constants["TOKENIZER"] = str(assets / tokenizer)
        overrides = [f"{key}={value!r}" for key, value in constants.items()] + list(set_items)
        return SourceModel(exp or EXPERIMENT, overrides, f"{family.name} ({source.name})", files)

    @staticmethod
    def _check_vocabulary(path: Path, vocab_size: int) -> None:
        from pax_lm.tokenizers import tokenizer_from_path

        size = tokenizer_from_path(str(path)).vocab_size
        if size > vocab_size:
            raise UsageError(f"{path} has {size} tokens and the model's embedding {vocab_size} "
                             f"rows; the tokenizer is not this model's")

    def read(self, source: Path, model: Any) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
        decoder = model.decoder
        family = families.family_of(_config(source))
        available = list_tensors(source)
        found = _aliases(available)
        used = set()
        for entry in tensors.entries(family.names, decoder):
            arrays = []
            for name, shape in zip(entry.hf, entry.hf_shapes, strict=True):
                info = found.get(name)
                if info is None:
                    raise UsageError(f"{source}: the weights lack {name}, which a "
                                     f"{family.name} model of this config.json holds")
                if info.shape != shape:
                    raise UsageError(f"{source}: {name} is {info.shape} in the weights and "
                                     f"{shape} in config.json's model")
                arrays.append(read_tensor(info))
                used.add(name)
            for path, array in zip(entry.pax, entry.to_pax(arrays), strict=True):
                yield ("decoder", *path), array
        extra = sorted(n for n in found if n not in used and not _ignored(n, decoder))
        if extra:
            raise UsageError(f"{source}: the weights hold {extra[0]}, which a {family.name} "
                             f"model of this config.json does not have")

    def write(self, output: Path, model: Any, params: Callable[[tuple[str, ...]], np.ndarray],
              datasets: list[Any]) -> None:
        decoder = model.decoder
        family, model_type = families.model_type_of(decoder)
        tokenizer = next((getattr(d, "tokenizer", None) for d in datasets if d.is_training), None)
        # The job's compute dtype: a model that runs in bfloat16 (as published checkpoints
        # are) is handed on in bfloat16, a float32 one exactly as trained.
        dtype = "float32" if decoder.dtype == "float32" else "bfloat16"
        stored = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
        config = {"architectures": [_ARCHITECTURES[model_type]], "model_type": model_type,
                  **family.write(decoder), "torch_dtype": dtype}
        if tokenizer is not None:
            config.update(bos_token_id=tokenizer.bos_id, eos_token_id=tokenizer.eos_id)
        entries = tensors.entries(family.names, decoder)
        fetch = merging(decoder, params)

        def converted() -> Iterator[tuple[str, np.ndarray]]:
            for entry in entries:
                values = entry.to_hf([fetch(("decoder", *p)) for p in entry.pax])
                yield from ((name, value.astype(stored))
                            for name, value in zip(entry.hf, values, strict=True))

        write_tensors(output, converted())
        (output / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        generation = {"bos_token_id": config.get("bos_token_id"),
                      "eos_token_id": config.get("eos_token_id"), "do_sample": False}
        (output / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        if tokenizer is not None and getattr(tokenizer, "name", "bytes") != "bytes":
            folder = Path(tokenizer.name).parent
            for name in TOKENIZER_FILES:
                if (folder / name).exists():
                    shutil.copyfile(folder / name, output / name)


def merging(decoder: Any, params: Callable[[tuple[str, ...]], np.ndarray]
            ) -> Callable[[tuple[str, ...]], np.ndarray]:
    """``params`` with each adapted kernel's low-rank adapter folded in: what a model with
    adapters computes, as plain weights."""
    lora = decoder.lora()
    if lora is None:
        return params

    def fetch(path: tuple[str, ...]) -> np.ndarray:
        value = params(path)
        if path[-1] == "kernel" and lora.adapts("/".join(path[-3:-1])):
            a, b = (params((*path[:-1], name)) for name in ("lora_a", "lora_b"))
            value = merge_adapter(value, a, b, lora.scale)
        return value

    return fetch


_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                  "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                  "gemma": "GemmaForCausalLM", "gemma2": "Gemma2ForCausalLM",
                  "gemma3_text": "Gemma3ForCausalLM", "gpt2": "GPT2LMHeadModel",
                  "gpt_neox": "GPTNeoXForCausalLM", "phi": "PhiForCausalLM",
                  "mixtral": "MixtralForCausalLM"}


def _aliases(available: dict[str, Any]) -> dict[str, Any]:
    """Tensor names as the naming tables spell them: GPT-2 checkpoints saved from the bare
    model lack the ``transformer.`` prefix."""
    if "wte.weight" in available:
        return {f"transformer.{name}": info for name, info in available.items()}
    return available


def _ignored(name: str, decoder: Any) -> bool:
    """Tensors a checkpoint may carry that are not weights of the model: buffers, and the copy
    of a tied embedding some checkpoints keep as the head."""
    if name.endswith(tensors.IGNORED_SUFFIXES):
        return True
    return decoder.tied_embedding and name in ("lm_head.weight", "embed_out.weight")
