"""A decoder LM trained the way a user writes it by hand: flax linen layers, optax, one jitted
step, a Python loop. Nothing here comes from Pax: it is the independent baseline that
``bench/train_speed.py`` holds ``pax train`` against.

The model is written for the same math as the experiment it stands beside (GPT-style:
LayerNorm, GELU, tied embedding; llama-style: RMSNorm, gated SiLU, untied), rotary positions,
packed documents kept apart by a segment mask, and the same optimizer (global-norm clipping,
Adam, per-tensor update clipping, decoupled weight decay, warm-up then cosine decay). It trains
on batches saved to an ``.npz`` file (``ids``, ``labels``, ``weights``, ``segment_ids``,
``segment_pos``, each [steps, batch, length]) and saves its final parameters and optimizer
state with Orbax, as a user's script would.

With ``plain`` in the config it is the least a user writes instead, for an experiment that asks
for nothing more (``bench/models.py:BenchLlama25MPlain``): unpacked rows (plain causal
attention, positions 0..L-1, the mean loss over every token; only ``ids`` and ``labels`` are
read) and ``optax.adam`` at a constant learning rate, with no clipping or decay.

    python bench/handwritten.py --batches B.npz --config '{"layers": 4, ...}' --warmup 10
        [--checkpoint DIR]

Prints one JSON line: tokens/s of each interval of ``--warmup`` steps after the first, the
first step's time (compile included), seconds from process start to the end of the first
step, and the losses.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

# The arrays of a saved batch (the full math reads them all, the plain mode ids and labels).
KEYS = ("ids", "labels", "weights", "segment_ids", "segment_pos")


@dataclasses.dataclass(frozen=True)
class Config:
    vocab: int
    layers: int
    dims: int
    heads: int
    head_dims: int
    hidden: int
    style: str  # "gpt": LayerNorm, GELU, tied; "llama": RMSNorm, gated SiLU, untied
    learning_rate: float
    warmup_steps: int
    decay_steps: int
    min_ratio: float
    weight_decay: float
    beta2: float
    # Loss and Adam's update alone: no segment mask, weights, clipping, decay or schedule.
    plain: bool = False


def rope(x: jax.Array, positions: jax.Array) -> jax.Array:
    """Rotary positions, rotate-half convention, x [B, L, N, H]."""
    half = x.shape[-1] // 2
    freqs = 1.0 / 10000.0 ** (jnp.arange(half, dtype=jnp.float32) * 2 / x.shape[-1])
    angles = positions[:, :, None, None].astype(jnp.float32) * freqs
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    x1, x2 = x[..., :half], x[..., half:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


class Block(nn.Module):
    c: Config

    def norm(self, name: str) -> nn.Module:
        if self.c.style == "llama":
            return nn.RMSNorm(epsilon=1e-6, name=name)
        return nn.LayerNorm(epsilon=1e-6, use_fast_variance=False, name=name)

    @nn.compact
    def __call__(self, x: jax.Array, positions: jax.Array, mask: jax.Array | None
                 ) -> jax.Array:
        c = self.c
        init = nn.initializers.variance_scaling(1.0, "fan_in", "normal")
        h = self.norm("attention_norm")(x)
        q, k, v = (nn.DenseGeneral((c.heads, c.head_dims), use_bias=False, kernel_init=init,
                                   name=n)(h) for n in ("query", "key", "value"))
        q, k = rope(q, positions), rope(k, positions)
        a = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True)
        x = x + nn.DenseGeneral(c.dims, axis=(-2, -1), use_bias=False, kernel_init=init,
                                name="out")(a)
        h = self.norm("ffn_norm")(x)
        up = nn.Dense(c.hidden, use_bias=False, kernel_init=init, name="wi")(h)
        if c.style == "llama":
            gate = nn.Dense(c.hidden, use_bias=False, kernel_init=init, name="wi_gate")(h)
            up = nn.silu(gate) * up
        else:
            up = nn.gelu(up, approximate=False)
        return x + nn.Dense(c.dims, use_bias=False, kernel_init=init, name="wo")(up)


class Decoder(nn.Module):
    c: Config

    @nn.compact
    def __call__(self, ids, segment_ids=None, positions=None):
        c = self.c
        table = nn.initializers.normal(1.0 / math.sqrt(c.dims))
        embed = nn.Embed(c.vocab, c.dims, embedding_init=table, name="embedding")
        x = embed(ids) * math.sqrt(c.dims) if c.style == "gpt" else embed(ids)
        if segment_ids is None:  # unpacked rows: causal attention alone
            mask, positions = None, jnp.arange(ids.shape[1])[None]
        else:
            mask = (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
        for i in range(c.layers):
            x = Block(c, name=f"layer_{i}")(x, positions, mask)
        x = (nn.RMSNorm(epsilon=1e-6, name="final_norm") if c.style == "llama"
             else nn.LayerNorm(epsilon=1e-6, use_fast_variance=False, name="final_norm"))(x)
        if c.style == "gpt":
            return embed.attend(x)
        return nn.Dense(c.vocab, use_bias=False, kernel_init=table, name="softmax")(x)


def optimizer(c: Config) -> optax.GradientTransformation:
    if c.plain:
        return optax.adam(c.learning_rate, b1=0.9, b2=c.beta2, eps=1e-6)
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, c.learning_rate, c.warmup_steps, c.decay_steps, c.learning_rate * c.min_ratio)
    return optax.chain(optax.clip_by_global_norm(1.0),
                       optax.scale_by_adam(b1=0.9, b2=c.beta2, eps=1e-6),
                       optax.clip_by_block_rms(1.0),
                       optax.add_decayed_weights(c.weight_decay),
                       optax.scale_by_learning_rate(schedule))


def loss_fn(model: Decoder, params, batch) -> jax.Array:
    if model.c.plain:
        logits = model.apply({"params": params}, batch["ids"])
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"]))
    logits = model.apply({"params": params}, batch["ids"], batch.get("segment_ids"),
                         batch.get("segment_pos"))
    xent = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
    return jnp.sum(xent * batch["weights"]) / jnp.maximum(jnp.sum(batch["weights"]), 1.0)


def seconds_since_process_start() -> float:
    """This process's age, from the kernel's records (Linux)."""
    with open("/proc/self/stat") as f:
        started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--checkpoint")
    args = parser.parse_args()
    c = Config(**json.loads(args.config))
    with np.load(args.batches) as saved:
        data = dict(saved)
    steps = data["ids"].shape[0]
    keys = ("ids", "labels") if c.plain else tuple(k for k in KEYS if k in data)

    def batch(i: int) -> dict[str, np.ndarray]:
        return {k: data[k][i] for k in keys}

    model, tx = Decoder(c), optimizer(c)
    first = batch(0)
    params = jax.jit(model.init)(jax.random.key(0), first["ids"], first.get("segment_ids"),
                                 first.get("segment_pos"))["params"]
    opt_state = tx.init(params)

    @jax.jit
    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(model, p, batch))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    tokens_per_step = first["ids"].size
    losses, times = {}, {}
    start = time.perf_counter()
    for step in range(1, steps + 1):
        params, opt_state, loss = train_step(params, opt_state, batch(step - 1))
        if step == 1:
            loss.block_until_ready()
            first_step_sec = time.perf_counter() - start
            startup_sec = seconds_since_process_start()
        if step % args.warmup == 0:
            losses[step] = float(loss)
            times[step] = time.perf_counter()
    if args.checkpoint:
        import orbax.checkpoint as ocp

        with ocp.StandardCheckpointer() as checkpointer:
            checkpointer.save(os.path.abspath(args.checkpoint),
                              {"params": params, "opt_state": opt_state})
    marks = sorted(times)
    print(json.dumps({
        "interval_tokens_per_sec": [args.warmup * tokens_per_step / (times[b] - times[a])
                                    for a, b in itertools.pairwise(marks)],
        "first_step_sec": first_step_sec,
        "startup_sec": startup_sec,
        "losses": {str(k): v for k, v in losses.items()},
    }))


if __name__ == "__main__":
    main()
