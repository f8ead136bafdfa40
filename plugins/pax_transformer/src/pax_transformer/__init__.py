"""Pax transformer layers: attention, feed-forward, norms, positions, remat, and a decoder-only LM.

The names below are imported lazily (PEP 562) so that importing ``pax_transformer.plugin``,
which ``pax plugins`` does, never imports JAX.
"""

from __future__ import annotations

from pax_core import public_face

__version__ = "0.1.0"

_EXPORTS = {
    # the decoder-only LM and its sizes
    "TransformerLm": "pax_transformer.models",
    "count_params": "pax_transformer.models",
    "count_active_params": "pax_transformer.models",
    "train_flops_per_token": "pax_transformer.models",
    "FLOPS_FORMULA_VERSION": "pax_transformer.models",
    # blocks, their parts and their stack
    "BlockConfig": "pax_transformer.layers.block",
    "TransformerBlock": "pax_transformer.layers.block",
    "block_weights": "pax_transformer.layers.block",
    "block_active_weights": "pax_transformer.layers.block",
    "block_train_flops_per_token": "pax_transformer.layers.block",
    "build_part": "pax_transformer.layers.parts",
    "active_weights": "pax_transformer.layers.parts",
    "TransformerStack": "pax_transformer.layers.stack",
    "stack_layer_params": "pax_transformer.layers.stack",
    # the parts other packages build their own blocks from
    "Attention": "pax_transformer.layers.attention",
    "FeedForward": "pax_transformer.layers.feedforward",
    "MoeFeedForward": "pax_transformer.layers.moe",
    "Projection": "pax_transformer.layers.dense",
    "Norm": "pax_transformer.layers.normalization",
    "BatchNorm": "pax_transformer.layers.normalization",
    "TokenEmbedding": "pax_transformer.layers.embedding",
    "Softmax": "pax_transformer.layers.embedding",
    # the next-token loss, a chunk of positions at a time
    "TokenLoss": "pax_transformer.layers.cross_entropy",
    "cross_entropy": "pax_transformer.layers.cross_entropy",
    "sinusoidal": "pax_transformer.layers.positions",
    "apply_rotary": "pax_transformer.layers.positions",
    "rotation": "pax_transformer.layers.positions",
    "rotate": "pax_transformer.layers.positions",
    "rotary_frequencies": "pax_transformer.layers.positions",
    "RotaryScaling": "pax_transformer.layers.positions",
    "LearnedPositions": "pax_transformer.layers.positions",
    "dense_init": "pax_transformer.layers.initializers",
    # low-rank adapters
    "Lora": "pax_transformer.layers.lora",
    "ADAPTER_WEIGHTS": "pax_transformer.layers.lora",
    "merge_adapter": "pax_transformer.layers.lora",
    "table_init": "pax_transformer.layers.initializers",
}
__all__ = sorted(["__version__", *_EXPORTS])
__getattr__ = public_face(__name__, _EXPORTS)
