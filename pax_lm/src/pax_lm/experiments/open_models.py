"""The published sizes of the open decoder families, as named experiments.

Each model is the ``config.json`` entries of its published checkpoint (``PUBLISHED``: data, as
torchtitan keeps its sizes), turned into Pax's constants by the ``hf`` format's own reading
(``pax_lm.hf.families``), so a named experiment and an import of the published folder build
the same model: ``pax import hf`` of a downloaded Llama 3.1 8B gives the layout of
``Llama3_1_8B``, and ``--init-from`` that folder starts the experiment from it. Each declares
a mesh for the hardware it is usually trained on (FSDP over ``data``, tensor parallelism over
``mdl`` for the 70B, Mixtral's experts split over an ``expert`` axis: ``ExpertParallel``) and
scans its layers with Pax's full rematerialisation, the settings a long run wants; its
tokenizer is the model's own ``tokenizer.json`` (``TOKENIZER``), which the user points at.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pax_lm.experiments.base import ExpertParallel
from pax_lm.experiments.open_weights import OpenWeightsLm
from pax_lm.hf.families import constants

_LLAMA3_ROPE = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                    original_max_position_embeddings=8192)
_LLAMA3 = dict(model_type="llama", vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0,
               max_position_embeddings=131072, hidden_act="silu")
_MIXTRAL = dict(model_type="mixtral", num_key_value_heads=8, rms_norm_eps=1e-5,
                rope_theta=1000000.0, sliding_window=None, tie_word_embeddings=False,
                hidden_act="silu", num_local_experts=8, num_experts_per_tok=2,
                router_jitter_noise=0.0, output_router_logits=False)
_GEMMA = dict(rms_norm_eps=1e-6, head_dim=256, query_pre_attn_scalar=256,
              hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)

PUBLISHED: dict[str, dict[str, Any]] = {
    "Llama3_1_8B": dict(_LLAMA3, hidden_size=4096, intermediate_size=14336,
                        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                        tie_word_embeddings=False, rope_scaling=_LLAMA3_ROPE),
    "Llama3_1_70B": dict(_LLAMA3, hidden_size=8192, intermediate_size=28672,
                         num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                         tie_word_embeddings=False, rope_scaling=_LLAMA3_ROPE),
    "Llama3_2_1B": dict(_LLAMA3, hidden_size=2048, intermediate_size=8192,
                        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                        head_dim=64, tie_word_embeddings=True,
                        rope_scaling=dict(_LLAMA3_ROPE, factor=32.0)),
    "Llama3_2_3B": dict(_LLAMA3, hidden_size=3072, intermediate_size=8192,
                        num_hidden_layers=28, num_attention_heads=24, num_key_value_heads=8,
                        head_dim=128, tie_word_embeddings=True,
                        rope_scaling=dict(_LLAMA3_ROPE, factor=32.0)),
    "Mistral7B": dict(model_type="mistral", vocab_size=32000, hidden_size=4096,
                      intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, rms_norm_eps=1e-5, rope_theta=10000.0,
                      max_position_embeddings=32768, sliding_window=4096,
                      tie_word_embeddings=False, hidden_act="silu"),
    "Qwen2_5_7B": dict(model_type="qwen2", vocab_size=152064, hidden_size=3584,
                       intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, rms_norm_eps=1e-6, rope_theta=1000000.0,
                       max_position_embeddings=131072, tie_word_embeddings=False,
                       hidden_act="silu"),
    "Qwen3_8B": dict(model_type="qwen3", vocab_size=151936, hidden_size=4096,
                     intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-6,
                     rope_theta=1000000.0, max_position_embeddings=40960,
                     tie_word_embeddings=False, hidden_act="silu"),
    "Gemma2_9B": dict(_GEMMA, model_type="gemma2", vocab_size=256000, hidden_size=3584,
                      intermediate_size=14336, num_hidden_layers=42, num_attention_heads=16,
                      num_key_value_heads=8, rope_theta=10000.0, max_position_embeddings=8192,
                      sliding_window=4096, attn_logit_softcapping=50.0,
                      final_logit_softcapping=30.0),
    "Gemma3_4B": dict(_GEMMA, model_type="gemma3_text", vocab_size=262208, hidden_size=2560,
                      intermediate_size=10240, num_hidden_layers=34, num_attention_heads=8,
                      num_key_value_heads=4, rope_theta=1000000.0, rope_local_base_freq=10000.0,
                      rope_scaling=dict(rope_type="linear", factor=8.0),
                      max_position_embeddings=131072, sliding_window=1024,
                      sliding_window_pattern=6),
    # v0.1; 8x22B with the 32768-token vocabulary of mistralai's folders (the first copies,
    # converted from the torrent, have 32000).
    "Mixtral8x7B": dict(_MIXTRAL, vocab_size=32000, hidden_size=4096, intermediate_size=14336,
                        num_hidden_layers=32, num_attention_heads=32,
                        max_position_embeddings=32768, router_aux_loss_coef=0.02),
    "Mixtral8x22B": dict(_MIXTRAL, vocab_size=32768, hidden_size=6144,
                         intermediate_size=16384, num_hidden_layers=56, num_attention_heads=48,
                         max_position_embeddings=65536, router_aux_loss_coef=0.001),
}


def published(name: str, mesh: list[int]) -> Callable[[type], type]:
    """Class decorator: the architecture of ``PUBLISHED[name]`` and the mesh ``mesh``, one
    size for each of the class's ``MESH_AXIS_NAMES`` (replica, data, mdl; with
    ``ExpertParallel``, replica, data, expert, mdl), with a sequence per device of the global
    batch."""
    settings = {**constants(PUBLISHED[name]), "ICI_MESH_SHAPE": mesh, "PERCORE_BATCH_SIZE": 1,
                "BATCH_SIZE": None, "USE_REPEATED_LAYER": True,
                "CHECKPOINT_POLICY": "SAVE_NOTHING", "FPROP_DTYPE": "bfloat16"}

    def apply(cls: type) -> type:
        if len(mesh) != len(cls.MESH_AXIS_NAMES):
            raise TypeError(f"{cls.__name__}: the mesh {mesh} has {len(mesh)} axes, its "
                            f"MESH_AXIS_NAMES {list(cls.MESH_AXIS_NAMES)} "
                            f"{len(cls.MESH_AXIS_NAMES)}")
        for key, value in settings.items():
            setattr(cls, key, value)
        return cls

    return apply


@published("Llama3_1_8B", [1, 8, 1])
class Llama3_1_8B(OpenWeightsLm):
    """Llama 3.1 8B (8,030,261,248 weights), FSDP over 8 devices (an 8-GPU host, a v5p-16)."""


@published("Llama3_1_70B", [1, 16, 4])
class Llama3_1_70B(OpenWeightsLm):
    """Llama 3.1 70B, FSDP over 16 and tensor-parallel over 4 (64 devices: a v5p-128)."""


@published("Llama3_2_1B", [1, 8, 1])
class Llama3_2_1B(OpenWeightsLm):
    """Llama 3.2 1B (tied embedding), FSDP over 8 devices."""


@published("Llama3_2_3B", [1, 8, 1])
class Llama3_2_3B(OpenWeightsLm):
    """Llama 3.2 3B (tied embedding), FSDP over 8 devices."""


@published("Mistral7B", [1, 8, 1])
class Mistral7B(OpenWeightsLm):
    """Mistral 7B v0.1 (a 4096-token sliding window), FSDP over 8 devices."""


@published("Qwen2_5_7B", [1, 8, 1])
class Qwen2_5_7B(OpenWeightsLm):
    """Qwen 2.5 7B (query, key and value biases), FSDP over 8 devices."""


@published("Qwen3_8B", [1, 8, 1])
class Qwen3_8B(OpenWeightsLm):
    """Qwen 3 8B (query and key norms), FSDP over 8 devices."""


@published("Gemma2_9B", [1, 8, 1])
class Gemma2_9B(OpenWeightsLm):
    """Gemma 2 9B (local and global layers, soft caps), FSDP over 8 devices."""


@published("Gemma3_4B", [1, 8, 1])
class Gemma3_4B(OpenWeightsLm):
    """Gemma 3 4B's text decoder (five local layers to a global one), FSDP over 8 devices."""


@published("Mixtral8x7B", [1, 8, 8, 1])
class Mixtral8x7B(ExpertParallel, OpenWeightsLm):
    """Mixtral 8x7B v0.1 (46,702,792,704 weights, 12,879,925,248 of them a token's: 2 of 8
    experts in every layer): one expert on each device of an expert axis of 8, FSDP over 8
    (64 devices)."""


@published("Mixtral8x22B", [1, 16, 8, 1])
class Mixtral8x22B(ExpertParallel, OpenWeightsLm):
    """Mixtral 8x22B v0.1 with mistralai's vocabulary of 32768 (140,630,071,296 weights,
    39,161,468,928 of them a token's): one expert on each device of an expert axis of 8, FSDP
    over 16 (128 devices)."""
