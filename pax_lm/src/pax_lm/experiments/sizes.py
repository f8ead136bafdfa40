"""Pax's decoder sizes, in one table the catalogue's experiments share.

An experiment takes its shape with ``@size("2B")``, which sets Pax's constants (``NUM_LAYERS``,
``MODEL_DIMS``, ``HIDDEN_DIMS``, ``NUM_HEADS``, ``DIMS_PER_HEAD``) on the class, so ``--set
NUM_LAYERS=4`` and subclasses override them as any other constant. Names are Pax's where Pax
names a size; the others say where the size comes from.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class LmSize:
    num_layers: int
    model_dims: int
    hidden_dims: int
    num_heads: int
    dims_per_head: int

    def constants(self) -> dict[str, int]:
        return {"NUM_LAYERS": self.num_layers, "MODEL_DIMS": self.model_dims,
                "HIDDEN_DIMS": self.hidden_dims, "NUM_HEADS": self.num_heads,
                "DIMS_PER_HEAD": self.dims_per_head}


SIZES: dict[str, LmSize] = {
    # lm_cloud and c4 (Pax's SPMD family; heads of 128)
    "spmd-base": LmSize(10, 2048, 8192, 16, 128),
    "spmd-test": LmSize(2, 64, 256, 8, 8),
    "1B": LmSize(13, 2560, 10240, 20, 128),
    "2B": LmSize(18, 3072, 12288, 24, 128),
    "9B": LmSize(48, 4096, 16384, 32, 128),
    "16B": LmSize(36, 6144, 24576, 48, 128),
    "32B": LmSize(40, 8192, 32768, 64, 128),
    "64B": LmSize(51, 10240, 40960, 80, 128),
    "128B": LmSize(71, 12288, 49152, 96, 128),
    "256B": LmSize(80, 16384, 65536, 128, 128),
    "512B": LmSize(102, 20480, 81920, 160, 128),
    "1024B": LmSize(142, 24576, 98304, 192, 128),
    # Pax's data-parallel lm_cloud model and the c4 mixins (heads of 64 and 128)
    "pmap-1024x32": LmSize(32, 1024, 4096, 16, 64),
    "c4-1024x32": LmSize(32, 1024, 4096, 16, 128),
    "c4-base": LmSize(24, 2048, 8192, 32, 64),
    "c4-2layer": LmSize(2, 2048, 8192, 32, 64),
    # GPT-3
    "gpt3-175B": LmSize(96, 12288, 49152, 96, 128),
    "gpt3-24x3072": LmSize(24, 3072, 12288, 24, 128),
    # MaxText's "MaxText to Pax" sizes (c4_multislice)
    "maxtext-22B": LmSize(48, 6144, 24576, 24, 256),
    "maxtext-22B-wide": LmSize(24, 9216, 36864, 24, 384),
    "maxtext-v4-8": LmSize(16, 2048, 8192, 8, 256),
    "maxtext-32B": LmSize(40, 8192, 32768, 32, 256),
    # Mixture-of-Experts (moe.py): the dense parts' shapes; the experts are the experiment's
    "glam-126m": LmSize(12, 768, 3072, 12, 64),
    "glam-64b": LmSize(64, 8192, 32768, 128, 128),
    "deepseek-moe-16b": LmSize(28, 2048, 10944, 16, 128),
    # one-chip speed benchmarks (benchmarks.py): llama-style, heads of 64 and 128
    "bench-24x1024": LmSize(24, 1024, 4096, 16, 64),
    "bench-16x2048": LmSize(16, 2048, 8192, 16, 128),
    # small models that train on a CPU
    "quickstart": LmSize(4, 192, 768, 4, 48),
    "tiny": LmSize(2, 64, 256, 4, 16),
}


def size(name: str) -> Callable[[type], type]:
    """Class decorator: give an experiment the constants of ``SIZES[name]``."""
    constants = SIZES[name].constants()

    def apply(cls: type) -> type:
        for key, value in constants.items():
            setattr(cls, key, value)
        return cls

    return apply
