"""Sets up the hand-written baseline for an experiment and checks that it is the same math.

Saves the experiment's first ``--steps`` training batches (what ``pax train`` reads, in order)
to ``--batches``, derives ``handwritten.Config`` from the experiment's model and optimizer,
and computes the loss of the first batch with both models from Pax's initial weights (renamed
into the hand-written tree): they must agree to float32 round-off, or the comparison would be
of two different models. Prints one JSON line: the config and both losses.

An experiment whose optimizer is Adam alone (no clipping, decay or schedule), which must then
train on unpacked rows (each one document, every token weighted 1: ``SyntheticDataset``), gets
the hand-written loop's plain mode, which computes nothing beyond that; any other gets its full
math.

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

from pax_core.config.optimizers import Adam, Optimizer
from pax_core.config.resolve import resolve
from pax_core.config.schedules import Constant
from pax_core.plugins.host import PluginHost

KEYS = handwritten.KEYS


def unpacked(batches: dict[str, np.ndarray]) -> bool:
    """Whether every row is one document from position 0, every token weighted 1 (rows without
    ``segment_ids`` are one document each)."""
    ids, pos = batches.get("segment_ids"), batches["segment_pos"]
    return bool(np.all(batches["weights"] == 1)
                and (ids is None or np.all(ids == ids[..., :1]))
                and np.all(pos == np.arange(pos.shape[-1])))


def plain_optimizer(optimizer: Optimizer) -> bool:
    """Whether the optimizer is Adam's update at a constant learning rate and nothing else, with
    the beta1 and epsilon the hand-written loop writes."""
    return (isinstance(optimizer, Adam) and optimizer.clip_gradient_norm_to_value == 0
            and (optimizer.beta1, optimizer.epsilon) == (0.9, 1e-6)
            and optimizer.update_clip_threshold == 0 and optimizer.weight_decay == 0
            and optimizer.l2_regularizer_weight == 0 and optimizer.ema_decay == 0
            and isinstance(optimizer.lr_schedule, Constant)
            and optimizer.lr_schedule.value == 1.0)


def hand_config(decoder, optimizer: Optimizer, plain: bool = False) -> handwritten.Config:
    style = "llama" if decoder.norm == "rmsnorm" else "gpt"
    expected = {"gpt": ("layernorm", "gelu", False, True, True),
                "llama": ("rmsnorm", "silu", True, False, False)}[style]
    found = (decoder.norm, decoder.activation, decoder.gated, decoder.tied_embedding,
             decoder.scale_embedding)
    if found != expected or decoder.position != "rotary" or decoder.use_bias:
        raise SystemExit(f"the hand-written model has no {found} variant")
    schedule = optimizer.lr_schedule
    common = dict(vocab=decoder.vocab_size, layers=decoder.num_layers, dims=decoder.model_dims,
                  heads=decoder.num_heads, head_dims=decoder.head_dims,
                  hidden=decoder.hidden_dims, style=style,
                  learning_rate=optimizer.learning_rate, beta2=optimizer.beta2)
    if plain:
        return handwritten.Config(**common, warmup_steps=0, decay_steps=0, min_ratio=1.0,
                                  weight_decay=0.0, plain=True)
    return handwritten.Config(**common, warmup_steps=schedule.warmup_steps,
                              decay_steps=schedule.decay_end, min_ratio=schedule.min_ratio,
                              weight_decay=optimizer.weight_decay)


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
    stacked = {k: np.stack([b[k] for b in batches]) for k in KEYS if k in batches[0]}
    np.savez(args.batches, **stacked)

    model, optimizer = job.task.model, job.task.train.learner.optimizer
    plain = plain_optimizer(optimizer)
    if plain and not unpacked(stacked):
        raise SystemExit("the hand-written loop's plain mode (Adam alone) reads unpacked rows; "
                         "this experiment packs documents or weights tokens")
    config = hand_config(model.decoder, optimizer, plain)
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
