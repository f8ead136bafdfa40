"""Splash attention (the tpu backend's kernel) against XLA's attention, in values and gradients,
through Pallas' interpreter on CPU at small shapes; the chip's own run at the benchmark's shapes
is bench/tpu_train.py's."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh

from pax_core import axes
from pax_core.backends import attention
from pax_core.backends.base import Backend
from pax_core.backends.splash import block_sizes, splash_attention, splash_unsupported
from pax_core.backends.tpu import TpuBackend

LENGTH = 256


def _inputs(batch=2, heads=4, kv_heads=2, length=LENGTH, dims=32, seed=0):
    keys = jax.random.split(jax.random.key(seed), 3)
    q = jax.random.normal(keys[0], (batch, length, heads, dims))
    k = jax.random.normal(keys[1], (batch, length, kv_heads, dims))
    v = jax.random.normal(keys[2], (batch, length, kv_heads, dims))
    return q, k, v


def _mask(length, *, causal, window=0, segment_ids=None):
    i, j = np.arange(length)[:, None], np.arange(length)[None]
    mask = jnp.asarray((j <= i) if causal else np.ones((length, length), bool))[None, None]
    if window:
        mask = mask & jnp.asarray(j > i - window)[None, None]
    if segment_ids is not None:
        mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])[:, None]
    return mask


def _both(kwargs, mask, q, k, v):
    """(values, gradients) of Splash and of XLA for the same attention."""
    def loss(fn):
        return lambda q, k, v: (fn(q, k, v) * jnp.cos(jnp.arange(q.shape[-1]))).sum()

    def splash(q, k, v):
        return splash_attention(q, k, v, interpret=True, **kwargs)

    def xla(q, k, v):
        return Backend().attention(q, k, v, mask=mask, **kwargs)

    results = []
    for fn in (splash, xla):
        value = jax.jit(fn)(q, k, v)
        grads = jax.jit(jax.grad(loss(fn), argnums=(0, 1, 2)))(q, k, v)
        results.append((value, grads))
    return results


def _close(got, expected):
    (value, grads), (value_x, grads_x) = got, expected
    np.testing.assert_allclose(value, value_x, atol=2e-5, rtol=1e-4)
    for g, g_x in zip(grads, grads_x, strict=True):
        np.testing.assert_allclose(g, g_x, atol=1e-4, rtol=1e-4)


SEGMENTS = jnp.asarray(np.repeat([[1, 2, 3, 4]], 2, 0).repeat(LENGTH // 4, 1)
                       * np.array([[1], [2]]))


@pytest.mark.parametrize("case", [
    dict(is_causal=True),
    dict(is_causal=False),
    dict(is_causal=True, window=48),
    dict(is_causal=True, segment_ids=SEGMENTS),
    dict(is_causal=True, logit_cap=2.0, scale=0.3),
], ids=["causal", "full", "window", "segments", "capped-scaled"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_splash_matches_xla_in_values_and_gradients(case, kv_heads):
    full = {**dict(segment_ids=None, window=0, logit_cap=0.0, scale=None), **case}
    mask = _mask(LENGTH, causal=full["is_causal"], window=full["window"],
                 segment_ids=full["segment_ids"])
    q, k, v = _inputs(kv_heads=kv_heads)
    _close(*_both(full, mask, q, k, v))


def test_splash_splits_batch_and_heads_as_the_rules_do():
    """On a mesh of 8 (data 4 x mdl 2), the kernel runs per device on its rows and heads."""
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "mdl"))
    rules = ((axes.BATCH, "data"), (axes.LENGTH, None), (axes.HEADS, "mdl"), (axes.KV, None))
    q, k, v = _inputs(batch=4)
    kwargs = dict(is_causal=True, segment_ids=None, window=0, logit_cap=0.0, scale=None)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        assert splash_unsupported(q, k, mask=None, is_causal=True, segment_ids=None) is None
        jaxpr = str(jax.make_jaxpr(lambda q, k, v: splash_attention(
            q, k, v, interpret=True, **kwargs))(q, k, v))
        _close(*_both(kwargs, _mask(LENGTH, causal=True), q, k, v))
    assert "shard_map" in jaxpr
    split_heads = ((axes.BATCH, None), (axes.LENGTH, None), (axes.HEADS, "data"),
                   (axes.KV, None))
    with jax.set_mesh(mesh), nn.logical_axis_rules(split_heads):
        assert "2 key heads over 4 devices" in splash_unsupported(
            q, k, mask=None, is_causal=True, segment_ids=None)
    by_length = ((axes.BATCH, None), (axes.LENGTH, "data"), (axes.HEADS, None),
                 (axes.KV, None))
    with jax.set_mesh(mesh), nn.logical_axis_rules(by_length):
        assert "sequence or head dimension split" in splash_unsupported(
            q, k, mask=None, is_causal=True, segment_ids=None)


def test_inside_a_shard_map_splash_runs_on_each_device_s_own_rows():
    """Pax's data-parallel (pmap) path runs the model inside ``shard_map`` (without JAX's
    varying-axes tracking, as ``pax_core.parallel.data_parallel`` does)."""
    from jax.sharding import PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:8]), ("data",))
    q, k, v = _inputs(batch=8)
    kwargs = dict(is_causal=True, segment_ids=None, window=0, logit_cap=0.0, scale=None)
    rows = PartitionSpec("data")

    def per_device(q, k, v):
        assert splash_unsupported(q, k, mask=None, is_causal=True, segment_ids=None) is None
        return splash_attention(q, k, v, interpret=True, **kwargs)

    got = jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(rows, rows, rows),
                                out_specs=rows, check_vma=False))(q, k, v)
    expected = Backend().attention(q, k, v, mask=_mask(LENGTH, causal=True), **kwargs)
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-4)


def test_what_splash_does_not_serve_is_named():
    q, k, _ = _inputs()
    cache = jnp.ones((1, 1, 1, LENGTH), bool)
    assert "decoding cache" in splash_unsupported(q[:, :1], k, mask=cache, is_causal=False,
                                                  segment_ids=None)
    assert "a sequence of 200" in splash_unsupported(q[:, :200], k[:, :200], mask=None,
                                                     is_causal=True, segment_ids=None)
    assert "1 queries over 256 keys" in splash_unsupported(q[:, :1], k, mask=None,
                                                           is_causal=False, segment_ids=None)


def test_block_sizes_are_the_largest_that_divide_the_sequence():
    assert block_sizes(2048).block_q == block_sizes(2048).block_kv_dkv == 1024
    assert block_sizes(2048).block_kv_compute == 512
    assert block_sizes(2560).block_q == 512
    assert block_sizes(768).block_kv == block_sizes(768).block_kv_compute == 256
    assert block_sizes(384).block_q_dkv == 128
    assert block_sizes(384).use_fused_bwd_kernel
    # float32 inputs: at most 512 (1,024 overflowed a v5e kernel's scoped on-chip memory)
    assert block_sizes(2048, itemsize=4).block_q == block_sizes(2048, 4).block_kv_dkv == 512
    assert block_sizes(768, itemsize=4).block_q == 256


@pytest.mark.parametrize("segments", [False, True], ids=["causal", "segments"])
def test_a_block_computed_in_parts_matches_xla(segments):
    """At 1,024 tokens a block of 1,024 keys is computed 512 at a time."""
    length = 1024
    ids = jnp.asarray(np.repeat([[1, 2]], 1, 0).repeat(length // 2, 1)) if segments else None
    kwargs = dict(is_causal=True, segment_ids=ids, window=0, logit_cap=0.0, scale=None)
    q, k, v = _inputs(batch=1, heads=2, kv_heads=1, length=length, dims=16)
    _close(*_both(kwargs, _mask(length, causal=True, segment_ids=ids), q, k, v))


@pytest.mark.parametrize("saved", [False, True], ids=["recomputed", "saved"])
def test_a_policy_that_saves_the_kernel_s_residuals_keeps_them(saved, capsys):
    """Under remat, the backward pass runs Splash's forward kernel again unless the policy
    saves ``pax_core.ATTENTION_RESIDUALS``: the kernel's output and softmax statistics."""
    from jax.ad_checkpoint import print_saved_residuals

    from pax_core import ATTENTION_RESIDUALS

    names = (ATTENTION_RESIDUALS,) if saved else ()
    policy = jax.checkpoint_policies.save_only_these_names(*names)
    q, k, v = _inputs(batch=1, heads=2, kv_heads=2)

    def loss(q, k, v):
        out = splash_attention(q, k, v, is_causal=True, segment_ids=None, interpret=True)
        return jnp.sin(out).sum()

    print_saved_residuals(jax.checkpoint(loss, policy=policy), q, k, v)
    kept = [line.split()[0] for line in capsys.readouterr().out.splitlines()
            if "output of jitted function '_splash_attention'" in line]
    assert kept == ([f"f32[1,2,{LENGTH},32]", f"f32[1,2,{LENGTH}]"] if saved else []), kept


def test_the_tpu_backend_serves_splash_and_says_once_why_not(monkeypatch, capsys):
    """Through ``pax_core.dot_product_attention``: Splash where it applies (its interpreter
    here), XLA with one warning line per reason where it does not."""
    monkeypatch.setattr(attention, "_running", attention._running)
    monkeypatch.setattr(attention, "_takes_all", attention._takes_all)
    served = []
    real = splash_attention

    def recording(*args, **kwargs):
        served.append(kwargs["window"])
        return real(*args, **{**kwargs, "interpret": True})

    monkeypatch.setattr("pax_core.backends.splash.splash_attention", recording)
    attention.use_backend(TpuBackend())
    q, k, v = _inputs()
    mask = _mask(LENGTH, causal=True, window=48)
    got = attention.dot_product_attention(q, k, v, mask=mask, is_causal=True, window=48)
    np.testing.assert_allclose(got, Backend().attention(q, k, v, mask=mask, is_causal=True,
                                                        segment_ids=None), atol=2e-5)
    assert served == [48] and capsys.readouterr().err == ""
    cache = jnp.ones((1, 1, 1, LENGTH), bool)
    for _ in range(2):
        attention.dot_product_attention(q[:, :1], k, v, mask=cache)
    assert capsys.readouterr().err.count("attention runs on XLA, not Splash, for a mask") == 1
    assert served == [48]
