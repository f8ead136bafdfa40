"""The ``peft`` weight format: a job's low-rank adapters as PEFT writes them.

``pax export --format peft --output DIR`` writes ``adapter_config.json`` and
``adapter_model.safetensors``, which ``peft.PeftModel.from_pretrained(base, DIR)`` loads onto
the Hugging Face model the job started from (the folder ``pax import hf`` read, or ``pax
export --format hf`` of the base job). PEFT keeps an adapter as two linear layers beside the
base one: ``lora_A.weight`` [rank, in] and ``lora_B.weight`` [out, rank] of the module whose
``.weight`` the ``hf`` format writes, so each of Pax's ``lora_a`` [inputs..., rank] and
``lora_b`` [rank, outputs...] is flattened and transposed. Only families whose adapted
projections are one Hugging Face linear layer each (the Llama-style ones: Llama, Mistral,
Qwen, Gemma) are written; ``--format hf`` folds the adapters into the weights for the others.
Import only (``pax import``) is not offered: PEFT folders hold no base model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from pax_core import UsageError, WeightFormat
from pax_lm.hf import families, tensors

ONE_LINEAR_NAMING = "llama"


class PeftFormat(WeightFormat):
    """PEFT's LoRA adapter folders (written only)."""

    reads: ClassVar[bool] = False

    def write(self, output: Path, model: Any, params: Callable[[tuple[str, ...]], np.ndarray],
              datasets: list[Any]) -> None:
        from safetensors.numpy import save_file

        decoder = model.decoder
        lora = decoder.lora()
        if lora is None:
            raise UsageError("the job has no adapters (LORA_RANK is 0); export the model with "
                             "--format hf")
        family, _ = families.model_type_of(decoder)
        if family.names != ONE_LINEAR_NAMING:
            raise UsageError(f"PEFT adapters are written for the Llama-style families (Llama, "
                             f"Mistral, Qwen, Gemma), not {family.name}; --format hf folds them "
                             f"into the weights")
        adapters = dict(_adapters(decoder, lora, params))
        targets = sorted({name.split(".")[-3] for name in adapters})
        save_file(adapters, str(output / "adapter_model.safetensors"))
        config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank,
                  "lora_alpha": lora.alpha, "lora_dropout": lora.dropout,
                  "target_modules": targets, "bias": "none", "fan_in_fan_out": False,
                  "inference_mode": True, "base_model_name_or_path": None}
        (output / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _adapters(decoder: Any, lora: Any, params: Callable[[tuple[str, ...]], np.ndarray]
              ) -> Iterator[tuple[str, np.ndarray]]:
    """PEFT's tensors, layer by layer: every adapted kernel's two in PEFT's layout."""
    looped = decoder.clone(scan_layers=False)  # its entries name each layer's modules
    stacked: dict[tuple[str, ...], np.ndarray] = {}
    for entry in tensors.entries(ONE_LINEAR_NAMING, looped):
        path = entry.pax[0]
        if (len(entry.pax) != 1 or path[-1] != "kernel"
                or not lora.adapts("/".join(path[-3:-1]))):
            continue
        module = entry.hf[0].removesuffix(".weight")
        a, b = (_layer_param(decoder, params, stacked, (*path[:-1], name))
                for name in ("lora_a", "lora_b"))
        rank = a.shape[-1]
        yield f"base_model.model.{module}.lora_A.weight", a.reshape(-1, rank).T.copy()
        yield f"base_model.model.{module}.lora_B.weight", b.reshape(rank, -1).T.copy()


def _layer_param(decoder: Any, params: Callable[[tuple[str, ...]], np.ndarray],
                 stacked: dict[tuple[str, ...], np.ndarray], path: tuple[str, ...]
                 ) -> np.ndarray:
    """The parameter at the looped ``path``; from a scanned stack, that layer of its stacked
    array (fetched once)."""
    if not decoder.scan_layers or path[0] != "stack":
        return np.asarray(params(("decoder", *path)), np.float32)
    key = ("decoder", "stack", "layers", *path[2:])
    if key not in stacked:  # adapters are small: each stacked one is fetched once, and kept
        stacked[key] = np.asarray(params(key), np.float32)
    return stacked[key][int(path[1].removeprefix("layer_"))]
