"""The recognizer's parts: CTC decoding and error rates against plain Python, the Conformer's
padding masks, its sizes and its FLOP formula."""

from __future__ import annotations

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_speech import decoding
from pax_speech.layers.conformer import ConformerConfig
from pax_speech.layers.frontend import LogMelConfig
from pax_speech.models import CtcRecognizer
from pax_speech.vocab import CharVocabulary


def _levenshtein(a, b) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def _padded(rows, width):
    out = np.zeros((len(rows), width), np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return jnp.asarray(out), jnp.asarray([len(r) for r in rows], jnp.int32)


def test_edit_distance_matches_levenshtein():
    rng = np.random.default_rng(0)
    hyps = [rng.integers(1, 5, size=rng.integers(0, 12)).tolist() for _ in range(40)]
    refs = [rng.integers(1, 5, size=rng.integers(0, 10)).tolist() for _ in range(40)]
    hyp, hyp_len = _padded(hyps, 14)
    ref, ref_len = _padded(refs, 11)
    got = jax.jit(decoding.edit_distance)(hyp, hyp_len, ref, ref_len)
    assert got.tolist() == [_levenshtein(h, r) for h, r in zip(hyps, refs, strict=True)]


def test_word_error_counts_match_the_words_of_the_strings():
    chars = CharVocabulary()
    pairs = [("the cat sat", "the cat sat"), ("the cat sat", "the bat sat down"),
             ("a  b", "b a"), ("", "one two"), ("seven of hearts", "seven of heart")]
    hyp, hyp_len = _padded([chars.encode(h) for h, _ in pairs], 24)
    ref, ref_len = _padded([chars.encode(r) for _, r in pairs], 24)
    counts = decoding.error_counts(hyp, hyp_len, ref, ref_len, space=1)
    words = [_levenshtein(h.split(), r.split()) for h, r in pairs]
    letters = [_levenshtein(chars.encode(h).tolist(), chars.encode(r).tolist()) for h, r in pairs]
    assert counts["word_edits"].tolist() == words
    assert counts["char_edits"].tolist() == letters
    assert counts["words"].tolist() == [len(r.split()) for _, r in pairs]


def test_greedy_decoding_merges_repeats_and_drops_blanks():
    path = np.array([[0, 3, 3, 0, 3, 5, 5, 0, 2, 2], [4, 4, 0, 0, 1, 0, 0, 0, 0, 7]])
    logits = jax.nn.one_hot(path, 8) * 5.0
    ids, lengths = decoding.greedy_decode(logits, jnp.asarray([10, 6]))
    assert lengths.tolist() == [4, 2]
    assert ids[0, :4].tolist() == [3, 3, 5, 2] and ids[1, :2].tolist() == [4, 1]
    assert int(ids[0, 4:].sum()) == int(ids[1, 2:].sum()) == 0


def _label_probability(log_probs, labels):
    """log P(labels) by summing every CTC path that collapses to them (tiny T only)."""
    total = -math.inf
    for path in itertools.product(range(log_probs.shape[1]), repeat=log_probs.shape[0]):
        collapsed = [c for i, c in enumerate(path) if c and (i == 0 or c != path[i - 1])]
        if collapsed == labels:
            total = np.logaddexp(total, sum(log_probs[t, c] for t, c in enumerate(path)))
    return total


def test_prefix_beam_search_finds_the_most_probable_labelling():
    """On 5 frames of 3 classes every labelling can be scored exactly: a wide beam finds the
    best. Where the best path is all blanks but "a" is likelier summed over its paths (0.64
    against 0.36), the beam finds "a"."""
    rng = np.random.default_rng(3)
    for _ in range(6):
        log_probs = np.log(rng.dirichlet(np.ones(3) * 0.7, size=5))
        candidates = {tuple(c for i, c in enumerate(p) if c and (i == 0 or c != p[i - 1]))
                      for p in itertools.product(range(3), repeat=5)}
        scores = {c: _label_probability(log_probs, list(c)) for c in candidates}
        assert tuple(decoding.prefix_beam_search(log_probs, beam=16)) == max(scores,
                                                                            key=scores.get)
    two_frames = np.log(np.array([[0.6, 0.4], [0.6, 0.4]]))
    assert decoding.prefix_beam_search(two_frames, beam=4) == [1]
    _, lengths = decoding.greedy_decode(jnp.asarray(two_frames[None]), jnp.asarray([2]))
    assert int(lengths[0]) == 0


TINY = ConformerConfig(model_dims=32, num_layers=2, num_heads=2, ffn_dims=64, conv_kernel=5,
                       subsampling_channels=8, dropout_rate=0.0)


@pytest.mark.parametrize("conv_norm", ["batchnorm", "groupnorm"])
@pytest.mark.parametrize("normalisation", ["utterance", "global"])
def test_padding_changes_no_valid_output(conv_norm, normalisation):
    """An utterance alone and the same utterance padded beside a longer one get the same
    log-probabilities on its frames, in evaluation and (batch norm's statistics aside, which
    count valid frames only) in a training step's forward pass."""
    model = CtcRecognizer(encoder=TINY.__class__(**{**TINY.__dict__, "conv_norm": conv_norm}),
                          features=LogMelConfig(num_mel_bins=40), normalisation=normalisation,
                          spec_augment=None)
    rng = np.random.default_rng(0)
    short = rng.normal(size=8000).astype(np.float32) * 0.1
    pad = np.concatenate([short, rng.normal(size=8000).astype(np.float32)])
    alone = {"audio": short[None], "audio_length": np.array([8000], np.int32)}
    padded = {"audio": np.stack([pad, rng.normal(size=16000).astype(np.float32)]),
              "audio_length": np.array([8000, 16000], np.int32)}
    variables = model.init(jax.random.key(0), alone["audio"], alone["audio_length"], False,
                           method=model.encode)
    a, a_len = model.apply(variables, **alone, method=model.transcribe)
    b, b_len = model.apply(variables, **padded, method=model.transcribe)
    n = int(a_len[0])
    assert n == int(b_len[0]) == 12  # 48 frames of 25 ms, subsampled 4x
    np.testing.assert_allclose(b[0, :n], a[0, :n], atol=2e-5)


def test_unalignable_utterances_are_counted_and_left_out_of_the_loss():
    model = CtcRecognizer(encoder=TINY, features=LogMelConfig(num_mel_bins=40),
                          spec_augment=None)
    audio = np.random.default_rng(0).normal(size=(2, 16000)).astype(np.float32)
    batch = {"audio": audio, "audio_length": np.array([16000, 4000], np.int32),
             "text": np.ones((2, 40), np.int32) * np.arange(1, 41) % 27 + 1,
             "text_length": np.array([10, 40], np.int32)}
    variables = model.init(jax.random.key(0), batch)
    out = model.apply(variables, batch)
    assert float(out.metrics["num_unalignable"][0]) == 1.0  # 4000 samples: 7 frames < 40
    assert np.isfinite(float(out.loss)) and float(out.loss) < 1e3
    assert {"cer", "wer"} <= set(out.metrics)


@pytest.mark.parametrize(("size", "dims", "layers", "heads", "ffn"),
                         [("S", 144, 16, 4, 576), ("M", 256, 16, 4, 1024),
                          ("L", 512, 17, 8, 2048)])
def test_conformer_sizes_and_the_flop_formula(size, dims, layers, heads, ffn):
    """Encoder weights of Gulati et al.'s sizes (their counts include an LSTM decoder we do
    not have: 10.3M, 30.7M, 118.8M), and the formula against XLA's count of the forward."""
    encoder = ConformerConfig(model_dims=dims, num_layers=layers, num_heads=heads,
                              ffn_dims=ffn, conv_kernel=32, subsampling_channels=dims)
    model = CtcRecognizer(encoder=encoder)
    spec = {"audio": jax.ShapeDtypeStruct((2, 16000 * 4), jnp.float32),
            "audio_length": jax.ShapeDtypeStruct((2,), jnp.int32)}
    shapes = jax.eval_shape(lambda a, n: model.init(jax.random.key(0), a, n, False,
                                                    method=model.encode),
                            spec["audio"], spec["audio_length"])
    weights = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes["params"]))
    expected = {"S": (8.0e6, 10.3e6), "M": (26e6, 30.7e6), "L": (100e6, 118.8e6)}[size]
    assert expected[0] < weights < expected[1]
    if size != "S":
        return
    compiled = jax.jit(lambda v, a, n: model.apply(v, a, n, False, method=model.encode)).lower(
        shapes, spec["audio"], spec["audio_length"]).compile()
    xla = compiled.cost_analysis()["flops"]
    forward = model.flops_per_step(spec) / 3
    assert 0.85 < forward / xla < 1.15
