"""Decoding many requests at once: an engine of KV-cache slots and continuous batching over it.

``Engine`` (``engine.py``) holds a fixed pool of decoding rows on the device: ``prefill`` runs
a prompt on its own (padded to a bucket length, so each bucket compiles once) and draws its
first token, ``insert`` puts it into a free slot, ``generate`` advances every slot one token in
one compiled program (each row at its own position, with its own sampling settings and seed),
``free`` gives a slot back. ``Batcher`` (``batching.py``) drives it from the host: requests
queue, join the batch as slots free up, end at a stop token, a stop string, ``max_tokens`` or
the model's maximum length, and leave; the function ``generate`` runs one prompt through an
engine of one slot. ``pax decode --prompts`` streams a file of prompts through it; a server adds
requests as they arrive and reads completions as they end.

``BeamSearch`` (``beam.py``) looks for the likeliest continuations of one prompt instead: its
beams are rows of a KV cache of their own, extended by one compiled step that keeps the best
``beam_size`` candidates and gathers their parents' cache rows; a hypothesis that emits eos is
finished, and hypotheses are ranked by log-probability over GNMT's length penalty
(``length_norm_alpha``). ``beam_search`` runs one prompt.
"""

from pax_lm.inference.batching import Batcher, Completion, FinishReason, Request, generate
from pax_lm.inference.beam import BeamSearch, Hypothesis, beam_search, length_penalty
from pax_lm.inference.engine import Engine, Prefilled, prefill_buckets

__all__ = ["Batcher", "BeamSearch", "Completion", "Engine", "FinishReason", "Hypothesis",
           "Prefilled", "Request", "beam_search", "generate", "length_penalty",
           "prefill_buckets"]
