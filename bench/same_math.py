"""Sets up the hand-written baseline for an experiment and checks that it is the same math.

Saves the experiment's first ``--steps`` training batches (what ``pax train`` reads, in order)
to ``--batches``, derives ``handwritten.Config`` from the experiment's model and optimizer,
and computes the loss of the first batch with both models from Pax's initial weights (renamed
into the hand-written tree): they must agree to float32 round-off, or the comparison would be
of two different models. Prints one JSON line: the config and both losses.

    python bench/same_math.py --exp lm/QuickStartLm --steps 30 --batches B.npz [--set K=V ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

import flax.linen as nn
import handwritten
import jax
import numpy as np

from pax_core.config.resolve import resolve
from pax_core.plugins.host import PluginHost

KEYS = ("ids", "labels", "weights", "segment_ids", "segment_pos")


def hand_config(decoder, optimizer) -> handwritten.Config:
    style = "llama" if decoder.norm == "rmsnorm" else "gpt"
    expected = {"gpt": ("layernorm", "gelu", False, True, True),
                "llama": ("rmsnorm", "silu", True, False, False)}[style]
    found = (decoder.norm, decoder.activation, decoder.gated, decoder.tied_embedding,
             decoder.scale_embedding)
    if found != expected or decoder.position != "rotary" or decoder.use_bias:
        raise SystemExit(f"the hand-written model has no {found} variant")
    schedule = optimizer.lr_schedule
    return handwritten.Config(
        vocab=decoder.vocab_size, layers=decoder.num_layers, dims=decoder.model_dims,
        heads=decoder.num_heads, head_dims=decoder.head_dims, hidden=decoder.hidden_dims,
        style=style, learning_rate=optimizer.learning_rate, warmup_steps=schedule.warmup_steps,
        decay_steps=schedule.decay_end, min_ratio=schedule.min_ratio,
        weight_decay=optimizer.weight_decay, beta2=optimizer.beta2)


def renamed(decoder_params: dict) -> dict:
    """Pax's decoder weights in the hand-written model's tree (the same shapes)."""
    tree = {k: v for k, v in decoder_params.items() if k != "stack"}
    for name, layer in decoder_params["stack"].items():
        tree[name] = {"attention_norm": layer["attention_norm"], "ffn_norm": layer["ffn_norm"],
                      **layer["attention"], **layer["ffn"]}
    return tree


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--exp", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--batches", required=True)
    parser.add_argument("--set", dest="set_items", action="append", default=[])
    args = parser.parse_args()

    job = resolve(PluginHost(), args.exp, None, args.set_items).build()
    data = next(d for d in job.datasets if d.is_training)
    data.shard(0, 1)
    batches = [data.get_next() for _ in range(args.steps)]
    np.savez(args.batches, **{k: np.stack([b[k] for b in batches]) for k in KEYS})

    model = job.task.model
    config = hand_config(model.decoder, job.task.train.learner.optimizer)
    first = batches[0]
    params = nn.unbox(jax.jit(lambda: model.init(jax.random.key(0), first))()["params"])
    pax_loss = float(jax.jit(lambda p: model.apply({"params": p}, first).loss)(params))
    hand = handwritten.Decoder(config)
    hand_loss = float(jax.jit(lambda p: handwritten.loss_fn(hand, p, first))(
        renamed(params["decoder"])))
    print(json.dumps({"config": dataclasses.asdict(config), "hand_loss": hand_loss,
                      "pax_loss": pax_loss}))
    if abs(hand_loss - pax_loss) > 1e-4 * abs(pax_loss):
        sys.exit(f"the hand-written model's loss {hand_loss} is not Pax's {pax_loss}")


if __name__ == "__main__":
    main()
