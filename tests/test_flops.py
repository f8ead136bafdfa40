"""FLOP counting: XLA's count corrected for loops, and the models' analytic formulas."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_core.config.resolve import resolve
from pax_core.run.build import build_run
from pax_core.run.compiled_steps import TrainSteps
from pax_core.speed.flops import hardware_flops, loop_correction, step_flops
from pax_core.testing import isolated_host

W = jnp.ones((128, 128))
X = jnp.ones((32, 128))
DOT = 2 * 32 * 128 * 128


def _compiled(fn, *args):
    return jax.jit(fn).lower(*args).compile()


def _layers(unroll: bool | int, length: int = 4):
    def fn(w, x):
        def body(c, _):
            return jnp.tanh(c @ w), None

        return jax.lax.scan(body, x, None, length=length, unroll=unroll)[0].sum()

    return fn


def test_a_scanned_loop_counts_every_iteration_like_the_unrolled_one():
    scanned, unrolled = _compiled(_layers(False), W, X), _compiled(_layers(True), W, X)
    # XLA alone counts the body once: that is what the correction is for.
    assert scanned.cost_analysis()["flops"] < 1.1 * DOT
    assert hardware_flops(scanned, 1) == pytest.approx(hardware_flops(unrolled, 1), rel=1e-3)
    assert hardware_flops(unrolled, 1) == pytest.approx(4 * DOT, rel=0.01)


def test_nested_loops_multiply_their_trip_counts():
    def nested(w, x):
        def inner(c, _):
            return jnp.tanh(c @ w), None

        def outer(c, _):
            return jax.lax.scan(inner, c, None, length=3)[0], None

        return jax.lax.scan(outer, x, None, length=2)[0].sum()

    compiled = _compiled(nested, W, X)
    assert loop_correction(compiled.as_text()) == pytest.approx(5 * DOT, rel=0.01)
    assert hardware_flops(compiled, 8) == pytest.approx(8 * 6 * DOT, rel=0.01)


def test_a_program_without_loops_is_xla_s_count_times_the_devices():
    compiled = _compiled(lambda w, x: (x @ w).sum(), W, X)
    assert loop_correction(compiled.as_text()) == 0
    assert hardware_flops(compiled, 2) == 2 * compiled.cost_analysis()["flops"]


def test_mlp_formula_is_six_flops_per_weight_and_example():
    host = isolated_host()
    run = build_run(host, resolve(host, "MlpSynthetic", None, []), jax.devices()[:1],
                    read_data=False)
    compiled = run.compile_train_step()
    counted = step_flops(run.task.model, run.batch_spec, compiled, 1)
    assert counted.formula == "dense-v1"
    assert counted.model == 6 * 64 * (16 * 64 + 64 * 4)
    # The program skips the gradient of the input features that 6 x W counts, and adds the
    # optimizer's and the loss's elementwise work.
    assert 0.7 < counted.hardware / counted.model < 1.2


def test_convolutions_in_a_loop_are_counted_like_unrolled_ones():
    kernel = jnp.ones((3, 3, 8, 8))  # HWIO

    def convs(unroll):
        def fn(k, x):
            def body(c, _):
                out = jax.lax.conv_general_dilated(c, k, (1, 1), "SAME",
                                                   dimension_numbers=("NHWC", "HWIO", "NHWC"))
                return jnp.maximum(out, 0.0), None

            return jax.lax.scan(body, x, None, length=3, unroll=unroll)[0].sum()

        return fn

    image = jnp.ones((2, 16, 16, 8))
    compiled = _compiled(convs(False), kernel, image)
    unrolled = hardware_flops(_compiled(convs(True), kernel, image), 1)
    assert compiled.cost_analysis()["flops"] < 0.4 * unrolled
    # XLA leaves out the kernel taps that fall on padding; the correction counts them all.
    assert unrolled <= hardware_flops(compiled, 1) < 1.1 * unrolled


def test_each_batch_shape_gets_its_own_compiled_step_and_its_own_flops():
    """An input batching by length gives several shapes: each compiles once, and MFU averages
    the FLOPs of the steps a summary covers."""
    host = isolated_host()
    run = build_run(host, resolve(host, "MlpSynthetic", None, []), jax.devices()[:1])
    steps = TrainSteps(run, host)
    state = run.init_state()
    batch = run.partitioner.global_batch(run.train_input.get_next())
    half = {k: v[: v.shape[0] // 2] for k, v in batch.items()}
    state, _ = steps(state, batch)
    state, metrics = steps(state, half)
    state, _ = steps(state, half)
    assert steps.num_shapes == 2
    assert np.isfinite(float(metrics["loss"]))
    full = steps.first_flops.model
    assert steps.flops_since_last().model == pytest.approx(full * (1 + 0.5 + 0.5) / 3)
    assert steps.flops_since_last() == steps.first_flops  # no step since the last summary


def test_a_compile_for_analysis_counts_and_places_as_the_full_compile():
    """pax plan compiles without optimising the CPU's machine code (it never runs the program):
    the FLOPs, bytes and buffers it reports are those of the full compile."""
    from pax_core.commands.plan import ANALYSIS_ONLY

    host = isolated_host()
    run = build_run(host, resolve(host, "MlpSynthetic", None, []), jax.devices(),
                    read_data=False)
    full = run.compile_train_step(donate_state=True)
    analysed = run.compile_train_step(donate_state=True, compiler_options=ANALYSIS_ONLY)
    for key in ("flops", "bytes accessed", "transcendentals"):
        assert analysed.cost_analysis()[key] == full.cost_analysis()[key], key
    memory, full_memory = analysed.memory_analysis(), full.memory_analysis()
    for key in ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
                "alias_size_in_bytes"):
        assert getattr(memory, key) == getattr(full_memory, key), key
    assert hardware_flops(analysed, 8) == hardware_flops(full, 8)


# A loop as the TPU compiler writes it: no note of its trip count, the counter's comparison
# inside a fusion of the condition.
FUSED_CONDITION_LOOP = """HloModule fused_condition

%fused_cond (p: s32[]) -> pred[] {
  %p = s32[] parameter(0)
  %bound = s32[] constant(24)
  ROOT %lt = pred[] compare(%p, %bound), direction=LT
}

%cond (t: (s32[], f32[32,128], f32[128,128])) -> pred[] {
  %t = (s32[], f32[32,128]{1,0}, f32[128,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  ROOT %f = pred[] fusion(%i), kind=kLoop, calls=%fused_cond
}

%body (t: (s32[], f32[32,128], f32[128,128])) -> (s32[], f32[32,128], f32[128,128]) {
  %t = (s32[], f32[32,128]{1,0}, f32[128,128]{1,0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[32,128]{1,0} get-tuple-element(%t), index=1
  %w = f32[128,128]{1,0} get-tuple-element(%t), index=2
  %d = f32[32,128]{1,0} dot(%x, %w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %one = s32[] constant(1)
  %n = s32[] add(%i, %one)
  ROOT %r = (s32[], f32[32,128]{1,0}, f32[128,128]{1,0}) tuple(%n, %d, %w)
}

ENTRY %main (x: f32[32,128], w: f32[128,128]) -> f32[32,128] {
  %x = f32[32,128]{1,0} parameter(0)
  %w = f32[128,128]{1,0} parameter(1)
  %zero = s32[] constant(0)
  %init = (s32[], f32[32,128]{1,0}, f32[128,128]{1,0}) tuple(%zero, %x, %w)
  %loop = (s32[], f32[32,128]{1,0}, f32[128,128]{1,0}) while(%init), condition=%cond, body=%body
  ROOT %out = f32[32,128]{1,0} get-tuple-element(%loop), index=1
}
"""


def test_a_loop_without_a_trip_count_note_is_counted_from_its_condition():
    """On a TPU the summary's HFU counted a scanned layer once: its loops carry no note of
    their trip count, and the bound is compared inside a fusion."""
    assert loop_correction(FUSED_CONDITION_LOOP) == pytest.approx(23 * (DOT + 1))
    scanned = _compiled(_layers(False), W, X).as_text()
    unnoted = scanned.replace('"known_trip_count":{"n":"4"}', '"n":"4"')
    assert unnoted != scanned
    assert loop_correction(unnoted) == pytest.approx(loop_correction(scanned))


# Two forms of the TPU compiler's: a projection to 16 heads written as a convolution whose
# window slides over padding (one tap of 16 touches the input), and a Splash kernel's call.
TPU_FORMS = """HloModule tpu_forms

ENTRY %main (x: bf16[8,2048,1024,1], w: bf16[1024,16,64,1], q: bf16[8,16,2048,64], k: bf16[8,4,2048,64]) -> bf16[8,2048,16,64] {
  %x = bf16[8,2048,1024,1]{3,2,1,0} parameter(0)
  %w = bf16[1024,16,64,1]{3,2,1,0} parameter(1)
  %q = bf16[8,16,2048,64]{3,2,1,0} parameter(2)
  %k = bf16[8,4,2048,64]{3,2,1,0} parameter(3)
  %splash_mha_dkv_no_residuals.1 = (bf16[8,4,2048,64]{3,2,1,0}) custom-call(%q, %k, %k), custom_call_target="tpu_custom_call"
  ROOT %convolution.1 = bf16[8,2048,16,64]{3,2,1,0} convolution(%x, %w), window={size=1x16 pad=0_0x15_15 rhs_reversal=0x1}, dim_labels=0bf1_i1o0->0b1f
}
"""  # noqa: E501


def test_the_tpu_s_padded_convolutions_and_splash_kernels_count_their_real_work():
    from pax_core.speed import hlo

    costs = {c.name: c.flops for c in hlo.step_costs(TPU_FORMS, 1)}
    assert costs["convolution.1"] == 2 * (8 * 2048) * 1024 * (16 * 64)  # the projection's
    # The key and value gradients: 4 products of [2048, 2048] x 64 for each of 16 query heads.
    splash = 2 * 4 * 8 * 16 * 2048 * 2048 * 64
    assert costs["splash_mha_dkv_no_residuals.1"] == splash
    assert loop_correction(TPU_FORMS) == splash  # XLA has no cost for the kernel
