"""The benchmark's larger model: a ~50M-parameter GPT on the quick start's data and settings.

Loaded by ``pax train --exp bench/models.py:BenchLm50M`` and by the bare loop alike.
"""

from __future__ import annotations

from pax_lm.experiments.quickstart import QuickStartLm


class BenchLm50M(QuickStartLm):
    """7 layers of width 768 (12 heads of 64, feed-forward 3072): 49.6M parameters."""

    NUM_LAYERS = 7
    MODEL_DIMS = 768
    HIDDEN_DIMS = 3072
    NUM_HEADS = 12
    DIMS_PER_HEAD = 64
    PERCORE_BATCH_SIZE = 2
