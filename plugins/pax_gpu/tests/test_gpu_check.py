"""``pax gpu check`` on CPU: without a GPU it says what to install in one line; with
``--platform cpu`` the comparisons that run off a GPU (XLA's attention, FP8 emulated by XLA)
are computed for real, and the table, the verdicts and the exit code follow from them.

What needs a GPU (cuDNN's rows, FP8 on FP8 tensor cores) is measured only by running the
command there; these tests check the machinery that measures it."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import pytest
from typer.testing import CliRunner

from pax_core.testing import run_pax
from pax_gpu import numerics
from pax_gpu.commands import app

INSTALL = ('pax: error: no GPU is visible to JAX here (it has: cpu); on a machine with NVIDIA '
           'GPUs install the CUDA jaxlib: pip install "pax-gpu[cuda12]"\n')


def test_without_a_gpu_the_check_says_what_to_install_in_one_line():
    result = run_pax("gpu", "check")  # JAX_PLATFORMS=cpu: no GPU, on any machine
    assert (result.returncode, result.stdout, result.stderr) == (2, "", INSTALL)


@pytest.mark.parametrize(("args", "line"), [
    (["--tolerance-scale", "0"], "--tolerance-scale must be above 0, got 0.0"),
    (["--platform", "tpu"], "--platform must be gpu or cpu, got 'tpu'"),
])
def test_a_bad_option_is_one_line(args, line):
    result = run_pax("gpu", "check", *args)
    assert (result.returncode, result.stderr) == (2, f"pax: error: {line}\n")


def _check(*args: str):
    return CliRunner().invoke(app, ["check", "--platform", "cpu", *args])


def _results(output: str) -> list[str]:
    """The result cell of every row of the table (a row's cells may wrap onto more lines)."""
    return re.findall(r"│ (pass|FAIL|skipped) +│", output)


def test_on_the_cpu_what_can_run_runs_and_passes():
    result = _check()
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("cpu device 0 of 8 (not a GPU: cuDNN's rows are skipped")
    results = _results(result.output)
    assert len(results) == len(numerics.ATTENTION_CASES) * 4 + len(numerics.MATMUL_SHAPES) * 2
    assert results.count("pass") == 12 and results.count("skipped") == 12
    assert result.output.count("cuDNN runs on NVIDIA GPUs, not cpu") == 10
    assert result.output.count("XLA emulates FP8 on cpu") == 4
    assert lines[-1] == "all 12 checks passed (12 skipped)"


def test_errors_beyond_the_tolerance_fail_the_check_with_exit_1():
    result = _check("--tolerance-scale", "0.01")
    assert result.exit_code == 1, result.output
    assert _results(result.output).count("FAIL") == 12
    assert result.output.splitlines()[-1] == "12 of 12 checks failed (12 skipped)"


@pytest.fixture
def cpu():
    """The device ``pax gpu check --platform cpu`` computes on, as its default device (which
    keys JAX's cache: the programs the command compiled are reused)."""
    device = jax.devices("cpu")[0]
    with jax.default_device(device):
        yield device


def _forward_row(tolerance: float) -> numerics.Row:
    return numerics.Row("attention", "", "", tolerance)


def test_each_tolerance_refuses_the_next_coarser_precision(cpu):
    """bfloat16 attention passes bfloat16's tolerance and fails float16's; the FP8 matmul
    passes its own and fails bfloat16's: a tolerance tells precisions apart."""
    case = numerics.ATTENTION_CASES[1]
    query, key, value, cotangent, segments = numerics.attention_inputs(case)
    want, _ = numerics.reference_attention(query, key, value, segments, cotangent, True)
    got, _ = numerics.attention_and_gradients(query, key, value, segments, cotangent,
                                              is_causal=True, implementation="xla")
    bf16, fp16 = (numerics.attention_tolerance(d, False) for d in (jnp.bfloat16, jnp.float16))
    assert numerics.compare(_forward_row(bf16), [got], [want]).status == numerics.PASS
    assert numerics.compare(_forward_row(fp16), [got], [want]).status == numerics.FAIL
    fp8, _ = numerics.fp8_rows(cpu, numerics.MATMUL_SHAPES[0])
    assert fp8.status == numerics.PASS
    assert fp8.relative > bf16


def test_attention_without_its_causal_mask_fails_by_far(cpu):
    """What a kernel that dropped the mask would show: an error of order one."""
    case = numerics.ATTENTION_CASES[1]
    query, key, value, cotangent, segments = numerics.attention_inputs(case)
    want, want_grads = numerics.reference_attention(query, key, value, segments, cotangent,
                                                    True)
    got, grads = numerics.attention_and_gradients(query, key, value, segments, cotangent,
                                                  is_causal=False, implementation="xla")
    tolerance = numerics.attention_tolerance(case.dtype, False)
    row = numerics.compare(_forward_row(tolerance), [got], [want])
    assert row.status == numerics.FAIL and row.relative > 0.1
    assert numerics.measure(grads, want_grads)[1] > 0.1


def test_a_row_that_cannot_run_fails_with_the_first_line_of_why(cpu):
    """cuDNN's path forced onto the CPU raises, as a GPU without a working cuDNN would: the
    rows say why, and the check fails."""

    class Pretending:
        platform, id, device_kind, compute_capability = "gpu", cpu.id, "stand-in", "9.0"

    rows = numerics.attention_rows(Pretending(), numerics.ATTENTION_CASES[0])
    cudnn = [r for r in rows if r.check.startswith("cuDNN")]
    assert [r.status for r in cudnn] == [numerics.FAIL] * 2
    assert all(r.note and "\n" not in r.note for r in cudnn)
    assert numerics.exit_code(rows) == 1
