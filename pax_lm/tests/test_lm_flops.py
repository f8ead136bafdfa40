"""The transformer's FLOP formula, and the compiled step's count through microbatch and layer
loops (XLA alone counts a loop body once)."""

from __future__ import annotations

import jax
import pytest

from pax_core.testing import PluginHost, build_run, resolve, step_flops


def _flops(*overrides: str):
    """(counted FLOPs, XLA's own count, run) of TinyLmForTests's train step on one device."""
    host = PluginHost()
    resolved = resolve(host, "TinyLmForTests", "lm", list(overrides))
    run = build_run(host, resolved, jax.devices()[:1], read_data=False)
    compiled = run.compile_train_step()
    xla = compiled.cost_analysis()["flops"]
    return step_flops(run.task.model, run.batch_spec, compiled, 1), xla, run


def test_microbatches_do_not_hide_flops_in_their_loop():
    whole, xla_whole, _ = _flops()
    split, xla_split, _ = _flops("task.train.learner.num_microbatches=4")
    assert whole.model == split.model
    assert xla_split < 0.5 * xla_whole  # XLA alone counts one microbatch of the four
    assert split.hardware == pytest.approx(whole.hardware, rel=0.01)


def test_scanned_layers_count_as_many_flops_as_looped_ones():
    looped, _, _ = _flops("NUM_LAYERS=4")
    scanned, xla_scanned, _ = _flops("NUM_LAYERS=4", "USE_REPEATED_LAYER=True")
    assert xla_scanned < 0.5 * looped.hardware  # XLA alone counts one layer of the four
    # The scanned program's backward pass does a little more than the unrolled one.
    assert looped.hardware <= scanned.hardware < 1.1 * looped.hardware


def test_transformer_formula_matches_a_hand_count_and_the_compiled_program():
    counted, _, run = _flops()
    decoder = run.task.model.decoder
    assert (decoder.norm, decoder.tied_embedding, decoder.use_bias) == ("layernorm", True, False)
    # 2 layers of width 64, 4 heads of 16, feed-forward 256 (non-gated), two layer norms each
    # (scale and bias); a final norm; the tied output projection over 259 tokens (256 bytes and
    # 3 specials). The embedding lookup multiplies nothing.
    d, f, v, layers, seq, tokens = 64, 256, 259, 2, 32, 8 * 32
    weights = layers * (4 * d * d + 2 * d * f + 2 * 2 * d) + 2 * d + v * d
    attention = 12 * layers * 4 * 16 * seq
    assert counted.formula == "transformer-v1"
    assert counted.model == tokens * (6 * weights + attention)
    # The program does what the formula counts, plus softmax, norms and the optimizer.
    assert 1.0 < counted.hardware / counted.model < 1.3
