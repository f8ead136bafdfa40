"""CHECKPOINT_POLICY="auto": the least recomputation whose compiled train step fits a device.

The host CPU reports no memory limit, so the tests give the devices one
(``pax_core.run.fitting.device_memory_limit``); everything else, the compiles and the
compiler's memory analysis included, is real.
"""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import pytest

import pax_core
from pax_core import UsageError
from pax_core.commands.plan import ANALYSIS_ONLY
from pax_core.config.resolve import choose_experiment, configure
from pax_core.run import fitting
from pax_core.run.build import Run, build_run
from pax_core.run.memory_use import planned_peak_bytes
from pax_core.testing import isolated_host, read_metrics
from pax_lm.experiments.base import REMAT_BY_MEMORY

SMALL = ["NUM_LAYERS=2", "MODEL_DIMS=64", "HIDDEN_DIMS=256", "NUM_HEADS=2", "DIMS_PER_HEAD=32",
         "VOCAB_SIZE=256", "MAX_SEQ_LEN=128", "ICI_MESH_SHAPE=[1,8,1]", "PERCORE_BATCH_SIZE=1"]


def _host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")),
                         ("transformer", importlib.import_module("pax_transformer.plugin")))


@pytest.fixture(scope="module")
def needs() -> dict[str | None, int]:
    """Each policy's arguments and temporaries, by the compiler's analysis."""
    host = _host()
    found = {}
    for policy in REMAT_BY_MEMORY:
        chosen = choose_experiment(host, "LlamaBench470M", "lm",
                                   [*SMALL, f"CHECKPOINT_POLICY={policy}"])
        run = build_run(host, configure(chosen), jax.devices(), read_data=False)
        # Compiled for analysis only: the same buffers, sooner (pax plan's compile).
        found[policy] = planned_peak_bytes(
            run.compile_train_step(compiler_options=ANALYSIS_ONLY), "cpu")
    return found


def _fitted(limit: int, monkeypatch) -> Run:
    monkeypatch.setattr(fitting, "device_memory_limit", lambda devices: limit)
    host = _host()
    chosen = choose_experiment(host, "LlamaBench470M", "lm", SMALL)
    return fitting.build_fitted_run(host, chosen, None, jax.devices(), read_data=False)


def test_auto_trains_with_the_least_recomputation_that_fits(needs, monkeypatch, tmp_path):
    # Recomputing less holds more: no remat needs the most, saving every product's output more
    # than saving the attention's projections.
    assert needs[None] > needs["SAVE_DOT_ONLY"] > needs["SAVE_CONTEXT_AND_OUT_PROJ"] \
        > needs["SAVE_NOTHING"]
    limit = (needs["SAVE_DOT_ONLY"] + needs["SAVE_DOT_FOR_MLPERF_200B"]) // 2
    monkeypatch.setattr(fitting, "device_memory_limit", lambda devices: limit)
    result = pax_core.train("LlamaBench470M", tmp_path / "job", plugin="lm",
                            overrides=[*SMALL, "NUM_TRAIN_STEPS=2", "SUMMARY_INTERVAL_STEPS=1"],
                            evaluate=False, host=_host())
    assert result.step == 2
    start = next(r for r in read_metrics(tmp_path / "job") if r["kind"] == "start")
    gib = {policy: f"{need / 2**30:.1f} GiB" for policy, need in needs.items()}
    assert start["fitted"] == [
        f"CHECKPOINT_POLICY=auto chose SAVE_DOT_FOR_MLPERF_200B for {limit / 2**30:.1f} GiB a "
        f"device (tried SAVE_DOT_ONLY {gib['SAVE_DOT_ONLY']}; SAVE_DOT_FOR_MLPERF_200B "
        f"{gib['SAVE_DOT_FOR_MLPERF_200B']}; SAVE_CONTEXT_AND_OUT_PROJ "
        f"{gib['SAVE_CONTEXT_AND_OUT_PROJ']})"]
    recorded = (tmp_path / "job" / "config.json").read_text()
    assert '"SAVE_DOT_FOR_MLPERF_200B"' in recorded


def test_auto_passes_over_a_fit_the_compiler_made_by_recomputing_more(needs, monkeypatch):
    # Near a TPU's memory limit XLA rematerialises more of a step on its own, which XLA:CPU
    # never does: here the first fitting policy's compiled program reads as so recomputed.
    heavy = needs["SAVE_DOT_FOR_MLPERF_200B"]
    monkeypatch.setattr(fitting, "compiler_rematerialised",
                        lambda compiled: planned_peak_bytes(compiled, "cpu") == heavy)
    run = _fitted((needs["SAVE_DOT_ONLY"] + heavy) // 2, monkeypatch)
    assert run.fitted[0].startswith("CHECKPOINT_POLICY=auto chose SAVE_CONTEXT_AND_OUT_PROJ")
    assert f"SAVE_DOT_FOR_MLPERF_200B {heavy / 2**30:.1f} GiB, the compiler recomputing" \
        in run.fitted[0]
    # Where every fit needs the compiler's recomputation, the first of them.
    monkeypatch.setattr(fitting, "compiler_rematerialised", lambda compiled: True)
    run = _fitted((needs["SAVE_DOT_ONLY"] + heavy) // 2, monkeypatch)
    assert run.fitted[0].startswith("CHECKPOINT_POLICY=auto chose SAVE_DOT_FOR_MLPERF_200B")


def test_the_compilers_own_rematerialisation_is_read_from_the_program():
    compiled = jax.jit(lambda x: x * 2).lower(jnp.ones(4)).compile()
    assert not fitting.compiler_rematerialised(compiled)

    class Program:  # an HLO text with one more instruction before the root
        def __init__(self, line):
            self.line = line

        def as_text(self):
            return compiled.as_text().replace("ROOT", f"{self.line}\n ROOT")

    # as XLA writes it after rematerialising a fusion (twice, for the second copy)
    assert fitting.compiler_rematerialised(Program("%fusion.3.remat = f32[4] copy(x)"))
    assert fitting.compiler_rematerialised(Program("%fusion.3.remat2 = f32[4] copy(x)"))
    # a layer's own name in an op's metadata is not the compiler's recomputation
    assert not fitting.compiler_rematerialised(Program(
        '%copy.1 = f32[4] copy(x), metadata={op_name="jit(f)/block.remat"}'))


def test_nothing_fitting_is_one_clear_message(needs, monkeypatch):
    with pytest.raises(UsageError, match=r"CHECKPOINT_POLICY=auto: no choice fits a device's "
                       r".* GiB \(.*SAVE_NOTHING .* GiB\); lower PERCORE_BATCH_SIZE"):
        _fitted(min(needs.values()) - 1, monkeypatch)


def test_without_a_memory_limit_auto_is_pax_s_default():
    host = _host()
    chosen = choose_experiment(host, "LlamaBench470M", "lm", SMALL)
    run = fitting.build_fitted_run(host, chosen, None, jax.devices(), read_data=False)
    assert run.task.model.decoder.remat_policy == "SAVE_NOTHING"
    assert run.first_step is None and run.fitted == []
