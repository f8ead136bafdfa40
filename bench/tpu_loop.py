"""A llama-style decoder trained by a plain, hand-written JAX loop on one TPU chip: the
independent baseline that ``bench/tpu_train.py`` holds ``pax train`` against. Nothing here comes
from Pax: the weights are a dict of arrays, the layers a ``jax.lax.scan`` under
``jax.checkpoint``, attention JAX's own Splash kernel, the optimizer optax's, one jitted step
with the state donated, a Python loop over one batch of random tokens kept on the chip.

    python bench/tpu_loop.py --model 470m --remat full [--batch 8] [--steps 20] [--block 1024]
        [--split-bwd] [--k-layout seq] [--profile DIR]

Prints one JSON line: tokens/s over ``--steps`` timed steps after three untimed ones, the step
time, MFU (PaLM's count: 6 per weight a token plus 12 x layers x dims x sequence for
attention), HFU (XLA's cost analysis of the step), and the device memory (what is in use
between steps plus the compiled step's temporaries).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time

import jax
import jax.numpy as jnp
import optax
from jax.experimental.pallas.ops.tpu import splash_attention as splash

MODELS = {  # layers, dims, heads, head dims, MLP, optimizer
    "470m": (24, 1024, 16, 64, 4096, "adam"),
    "1b": (16, 2048, 16, 128, 8192, "adafactor"),
}
VOCAB, SEQ = 32768, 2048
POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "qkv_out": jax.checkpoint_policies.save_only_these_names("q", "k", "v", "out"),
    "qkv_attn_out": jax.checkpoint_policies.save_only_these_names("q", "k", "v", "splash", "out"),
    "attn_out": jax.checkpoint_policies.save_only_these_names("splash", "out"),
    "none": None,
}
BF16 = jnp.bfloat16


def init(key, layers, dims, heads, head_dims, hidden):
    shapes = {"attn_norm": (layers, dims), "wq": (layers, dims, heads, head_dims),
              "wk": (layers, dims, heads, head_dims), "wv": (layers, dims, heads, head_dims),
              "wo": (layers, heads, head_dims, dims), "mlp_norm": (layers, dims),
              "w_gate": (layers, dims, hidden), "w_up": (layers, dims, hidden),
              "w_down": (layers, hidden, dims)}
    keys = iter(jax.random.split(key, len(shapes) + 2))
    stack = {name: (jnp.ones(shape) if name.endswith("norm") else
                    jax.random.normal(next(keys), shape) * 0.02) for name, shape in shapes.items()}
    return {"embed": jax.random.normal(next(keys), (VOCAB, dims)) * 0.02, "layers": stack,
            "final_norm": jnp.ones((dims,)),
            "unembed": jax.random.normal(next(keys), (dims, VOCAB)) * 0.02}


def rmsnorm(x, scale):
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + 1e-6)
    return (normed * scale).astype(BF16)


def rope(x, positions):
    half = x.shape[-1] // 2
    freqs = 1.0 / 10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions[:, None, None] * freqs  # [T, 1, half]
    sin, cos = jnp.sin(angles), jnp.cos(angles)
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).astype(BF16)


@functools.cache
def kernel(heads, block=1024, fused=True, k_layout="seq"):
    """Splash's tiles (keys computed 512 at a time): ``fused`` computes dq in the dk/dv kernel,
    one backward pass not two; ``k_layout`` lays the keys out head-minor or sequence-minor. Its
    output and statistics carry the name "splash" for a remat policy to save."""
    dq = {} if fused else {"block_q_dq": block, "block_kv_dq": block}
    compute = min(block, 512)
    layout = splash.QKVLayout.SEQ_MINOR if k_layout == "seq" else splash.QKVLayout.HEAD_DIM_MINOR
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=compute,
                              block_q_dkv=block, block_kv_dkv=block,
                              block_kv_dkv_compute=compute, use_fused_bwd_kernel=fused,
                              k_layout=layout, **dq)
    mask = splash.MultiHeadMask([splash.CausalMask((SEQ, SEQ))] * heads)
    return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                  residual_checkpoint_name="splash")


SPLASH = {"block": 1024, "fused": True, "k_layout": "seq"}


def layer(x, w):
    from jax.ad_checkpoint import checkpoint_name

    positions = jnp.arange(x.shape[1], dtype=jnp.float32)
    h = rmsnorm(x, w["attn_norm"])
    q, k, v = (checkpoint_name(jnp.einsum("btd,dnh->btnh", h, w[n].astype(BF16)), n[1])
               for n in ("wq", "wk", "wv"))
    q = rope(q, positions) * (q.shape[-1] ** -0.5)
    k = rope(k, positions)
    attend = jax.vmap(kernel(q.shape[2], **SPLASH))
    context = attend(*(jnp.swapaxes(t, 1, 2) for t in (q.astype(BF16), k, v)))
    context = jnp.swapaxes(context, 1, 2)
    out = checkpoint_name(jnp.einsum("btnh,nhd->btd", context, w["wo"].astype(BF16)), "out")
    x = x + out
    h = rmsnorm(x, w["mlp_norm"])
    gate = jax.nn.silu(h @ w["w_gate"].astype(BF16)) * (h @ w["w_up"].astype(BF16))
    return x + gate @ w["w_down"].astype(BF16), None


def loss_fn(params, ids, labels, policy):
    x = params["embed"].astype(BF16)[ids]
    body = layer if policy == "none" else jax.checkpoint(layer, policy=POLICIES[policy])
    x, _ = jax.lax.scan(body, x, params["layers"])
    x = rmsnorm(x, params["final_norm"])
    logits = (x @ params["unembed"].astype(BF16)).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default="470m")
    parser.add_argument("--remat", choices=POLICIES, default="full")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--peak-tflops", type=float, default=197.0)
    parser.add_argument("--block", type=int, default=1024, help="Splash's tile")
    parser.add_argument("--split-bwd", action="store_true",
                        help="Splash's two backward kernels (dq apart from dk, dv)")
    parser.add_argument("--k-layout", choices=("head", "seq"), default="seq")
    parser.add_argument("--profile", help="trace three steps with jax.profiler into this folder")
    args = parser.parse_args()
    SPLASH.update(block=args.block, fused=not args.split_bwd, k_layout=args.k_layout)
    layers, dims, heads, head_dims, hidden, optimizer = MODELS[args.model]
    params = init(jax.random.key(0), layers, dims, heads, head_dims, hidden)
    tx = optax.adam(3e-4, b2=0.95) if optimizer == "adam" else optax.adafactor(3e-4)
    opt_state = tx.init(params)
    tokens = jax.random.randint(jax.random.key(1), (args.batch, SEQ + 1), 0, VOCAB)
    ids, labels = tokens[:, :-1], tokens[:, 1:]

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def step(params, opt_state, ids, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, ids, labels, args.remat)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    compiled = step.lower(params, opt_state, ids, labels).compile()
    analysis = compiled.memory_analysis()
    for _ in range(3):
        params, opt_state, loss = compiled(params, opt_state, ids, labels)
    loss.block_until_ready()
    started = time.perf_counter()
    for _ in range(args.steps):
        params, opt_state, loss = compiled(params, opt_state, ids, labels)
    loss.block_until_ready()
    step_sec = (time.perf_counter() - started) / args.steps
    if args.profile:
        jax.profiler.start_trace(args.profile)
        for number in range(3):
            with jax.profiler.StepTraceAnnotation("train", step_num=number):
                params, opt_state, loss = compiled(params, opt_state, ids, labels)
        loss.block_until_ready()
        jax.profiler.stop_trace()
    weights = sum(math.prod(p.shape) for p in jax.tree.leaves(params)) - VOCAB * dims
    model_flops = args.batch * SEQ * (6 * weights + 12 * layers * heads * head_dims * SEQ)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    stats = jax.devices()[0].memory_stats() or {}
    in_use = stats.get("bytes_in_use", 0)
    working = analysis.temp_size_in_bytes + max(
        0, analysis.output_size_in_bytes - analysis.alias_size_in_bytes)
    print(json.dumps({
        "model": args.model, "remat": args.remat, "batch": args.batch, **SPLASH,
        "tokens_per_sec": args.batch * SEQ / step_sec, "step_sec": step_sec,
        "mfu": model_flops / step_sec / (args.peak_tflops * 1e12),
        "xla_flops_per_step": float(cost.get("flops", 0.0)),
        "device_memory_peak_gib": (in_use + working) / 2**30, "loss": float(loss),
        "memory_stats_gib": {k: round(v / 2**30, 3) for k, v in stats.items()
                             if isinstance(v, int) and "bytes" in k},
        "memory_analysis_gib": {n: round(getattr(analysis, n) / 2**30, 3)
                                for n in dir(analysis) if n.endswith("_in_bytes")}}))


if __name__ == "__main__":
    main()
