"""The gpu backend on CPU: its presets composed with the user's settings, the device check,
the refusal of FP8 on GPUs without FP8 tensor cores, and the attention selection (cuDNN mocked
only at the call that would run on the GPU: ``pax gpu check`` is what runs it, on a GPU)."""

from __future__ import annotations

import dataclasses
import importlib
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.linen import fp8_ops

from pax_core import Component, UsageError, apply_presets, hookimpl, parse_flags
from pax_core.testing import build_run, isolated_host, resolve
from pax_gpu import backends
from pax_gpu.backends import GpuBackend, cudnn_unsupported, fp8_unsupported


def test_presets_compose_with_what_the_user_set():
    environ = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 "
                            "--xla_gpu_enable_pipelined_all_reduce=false",
               "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.75", "PAX_NO_PRESETS": "gpu.nccl"}
    settings = apply_presets("gpu", GpuBackend().presets(), environ)
    flags = parse_flags(environ["XLA_FLAGS"])
    assert flags["--xla_force_host_platform_device_count"] == "8"
    assert flags["--xla_gpu_enable_pipelined_all_reduce"] == "false"  # the user's
    assert flags["--xla_gpu_enable_latency_hiding_scheduler"] == "true"
    assert flags["--xla_gpu_enable_pipelined_all_gather"] == "true"
    assert environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.75"
    assert environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "NCCL_LAUNCH_MODE" not in environ  # turned off by name
    kept = {s.name for s in settings if s.source == "yours"}
    assert kept == {"--xla_gpu_enable_pipelined_all_reduce", "XLA_PYTHON_CLIENT_MEM_FRACTION"}
    assert {s.preset for s in settings} == {
        "gpu.latency-hiding", "gpu.pipelined-collectives", "gpu.memory", "gpu.connections"}


def test_every_preset_flag_is_one_this_xla_knows():
    """An unknown flag in XLA_FLAGS aborts JAX at start-up; the CPU jaxlib knows GPU flags."""
    flags = {}
    for preset in GpuBackend().presets():
        flags.update(preset.flags)
    text = " ".join(f"{k}={v}" for k, v in flags.items())
    env = {**os.environ, "XLA_FLAGS": text, "JAX_PLATFORMS": "cpu"}
    started = subprocess.run([sys.executable, "-c", "import jax; jax.numpy.ones(1).sum()"],
                             env=env, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr[-2000:]


@dataclasses.dataclass
class FakeDevice:
    platform: str = "gpu"
    compute_capability: str = "9.0"
    device_kind: str = "NVIDIA H200"
    id: int = 0


def test_the_device_check_refuses_what_cannot_train():
    GpuBackend().check([FakeDevice(), FakeDevice(id=1, compute_capability="8.0")])
    with pytest.raises(UsageError, match=r"GPU 1 \(Tesla V100\) has compute capability 7.0; "
                                         r"Pax needs 8.0 or newer"):
        GpuBackend().check([FakeDevice(), FakeDevice("gpu", "7.0", "Tesla V100", 1)])
    with pytest.raises(UsageError, match="the gpu backend got cpu device 0"):
        GpuBackend().check(jax.devices()[:1])


@pytest.mark.parametrize(("capability", "refused"), [
    ("7.5", True), ("8.0", True), ("8.6", True), ("8.9", False), ("9.0", False),
    ("10.0", False), ("12.0", False), ("gfx942", False)])
def test_fp8_needs_compute_capability_8_9(capability, refused):
    reason = fp8_unsupported(capability)
    assert (reason is not None) == refused
    if refused:
        assert reason == (f"compute capability {capability}: FP8 tensor cores need 8.9 or "
                          f"newer (Ada, Hopper, Blackwell)")


def _traced(fp8: bool, scanned: bool = False) -> jax.extend.core.ClosedJaxpr:
    """A projection's matmul traced as the run's initialisation is: Flax's FP8 op (the one
    pax-transformer's projections run) or bfloat16, at top level or inside a scan."""
    x, w = jnp.ones((4, 8), jnp.bfloat16), jnp.ones((8, 8), jnp.bfloat16)
    dims = (((1,), (0,)), ((), ()))
    op = fp8_ops.Fp8DirectDotGeneralOp(amax_history_length=4)

    def matmul(x):
        if not fp8:
            return jnp.dot(x, w)
        return op.apply(op.init(jax.random.key(0), x, w, dims), x, w, dims)

    def program(x):
        if scanned:
            return jax.lax.scan(lambda c, _: (matmul(c), None), x, None, length=2)[0]
        return matmul(x)

    return jax.make_jaxpr(program)(x)


A100 = FakeDevice(compute_capability="8.0", device_kind="NVIDIA A100-SXM4-80GB")


@pytest.mark.parametrize("scanned", [False, True], ids=["top-level", "in-a-scan"])
def test_a_program_in_fp8_is_refused_on_gpus_without_fp8(scanned):
    with pytest.raises(UsageError) as refused:
        GpuBackend().check_program([FakeDevice(), A100], _traced(fp8=True, scanned=scanned))
    assert str(refused.value) == (
        "this run computes in FP8, and GPU 0 (NVIDIA A100-SXM4-80GB) has compute capability "
        "8.0: FP8 tensor cores need 8.9 or newer (Ada, Hopper, Blackwell); turn FP8 off "
        "(pax-lm: --set USE_FP8=False) or run on H100, H200, L4 or newer")
    GpuBackend().check_program([FakeDevice(), FakeDevice(compute_capability="8.9")],
                               _traced(fp8=True, scanned=scanned))
    GpuBackend().check_program([A100], _traced(fp8=False, scanned=scanned))


class A100sHere(GpuBackend):
    """The gpu backend's program check with this host's CPU devices standing in for A100s:
    their compute capability is all that check reads of a device."""

    platform = "cpu"
    capability = "8.0"

    def check(self, devices):
        pass

    def check_program(self, devices, program):
        super().check_program([FakeDevice(compute_capability=self.capability,
                                          device_kind="NVIDIA A100", id=d.id)
                               for d in devices], program)


class H100sHere(A100sHere):
    capability = "9.0"


def _host(backend):
    class StandIn:
        @hookimpl
        def pax_register_backends(self):
            return [Component("cpu", backend, "CPU devices standing in for GPUs")]

    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")),
                         ("transformer", importlib.import_module("pax_transformer.plugin")),
                         ("standin", StandIn()))


def test_an_fp8_run_is_refused_before_it_compiles():
    """``pax train --set USE_FP8=True`` on A100s stops while the run is built (the traced
    initialisation computes in FP8), before anything compiles; on H100s, or without FP8, it
    builds."""
    pytest.importorskip("pax_lm")
    a100s, h100s = _host(A100sHere), _host(H100sHere)
    fp8 = ["USE_FP8=True"]
    with pytest.raises(UsageError, match=r"this run computes in FP8, and GPU 0 \(NVIDIA A100\) "
                                         r"has compute capability 8.0: FP8 tensor"):
        build_run(a100s, resolve(a100s, "TinyLmForTests", "lm", fp8), jax.devices()[:1],
                  read_data=False)
    build_run(h100s, resolve(h100s, "TinyLmForTests", "lm", fp8), jax.devices()[:1],
              read_data=False)
    build_run(a100s, resolve(a100s, "TinyLmForTests", "lm", []), jax.devices()[:1],
              read_data=False)


def _qkv(dtype=jnp.bfloat16, length=16, head_dim=32):
    keys = jax.random.split(jax.random.key(0), 3)
    q, k, v = (jax.random.normal(kk, (2, length, 4, head_dim), dtype) for kk in keys)
    segments = jnp.array([[1] * 10 + [2] * 6, [1] * 16])
    causal = jnp.tril(jnp.ones((length, length), bool))[None, None]
    return q, k, v, segments, causal & backends.segment_mask(segments)


def test_cudnn_is_refused_for_what_it_cannot_serve():
    q, k, _, segments, mask = _qkv()
    assert cudnn_unsupported(q, k, mask=mask, is_causal=True, segment_ids=segments) is None
    cases = [
        ((q.astype(jnp.float32), k), dict(mask=mask, is_causal=True), "float32 inputs"),
        ((q[..., :12], k[..., :12]), dict(mask=mask, is_causal=True), "head dim 12"),
        ((q[:, :1], k), dict(mask=mask[:, :, :1], is_causal=True), "causal mask over 1 "),
        ((q[:, :1], k), dict(mask=mask[:, :, :1], is_causal=False), "a decoding cache's"),
    ]
    for args, kwargs, reason in cases:
        assert reason in cudnn_unsupported(*args, segment_ids=None, **kwargs)


def test_a_servable_shape_goes_to_cudnn_with_the_causal_flag_and_segment_mask(monkeypatch):
    real, calls = jax.nn.dot_product_attention, []

    def on_the_gpu(query, key, value, *, mask, is_causal, implementation):
        calls.append((implementation, is_causal, mask))
        return real(query, key, value, mask=mask, is_causal=is_causal, implementation="xla")

    monkeypatch.setattr(backends.jax.nn, "dot_product_attention", on_the_gpu)
    q, k, v, segments, mask = _qkv()
    served = GpuBackend().attention(q, k, v, mask=mask, is_causal=True, segment_ids=segments)
    [(implementation, is_causal, segment_mask)] = calls
    assert implementation == "cudnn" and is_causal
    assert segment_mask.shape == (2, 1, 16, 16)
    np.testing.assert_array_equal(segment_mask, backends.segment_mask(segments))
    expected = real(q, k, v, mask=mask)
    np.testing.assert_allclose(np.float32(served), np.float32(expected), atol=2e-2)


def test_a_fallback_says_why_once_and_computes_what_xla_does(monkeypatch, capsys):
    monkeypatch.setattr(backends, "_told", set())
    q, k, v, segments, mask = _qkv(jnp.float32)
    gpu = GpuBackend()
    for _ in range(2):
        out = gpu.attention(q, k, v, mask=mask, is_causal=True, segment_ids=segments)
    np.testing.assert_allclose(out, jax.nn.dot_product_attention(q, k, v, mask=mask), atol=1e-6)
    assert capsys.readouterr().err.splitlines() == [
        "pax: warning: attention runs on XLA, not cuDNN, for float32 inputs (cuDNN's fused "
        "attention takes bfloat16 or float16)"]


def test_trials_side_by_side_get_their_own_gpus(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    backend = GpuBackend()
    assert [backend.share(i, 4) for i in range(4)] == [
        {"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"},
        {"CUDA_VISIBLE_DEVICES": "4,5"}, {"CUDA_VISIBLE_DEVICES": "6,7"}]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert backend.share(1, 2) == {"CUDA_VISIBLE_DEVICES": "5"}
    with pytest.raises(UsageError, match="3 trials at once need a GPU each, and this host has 2"):
        backend.share(0, 3)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert backend.share(0, 2) == {}
