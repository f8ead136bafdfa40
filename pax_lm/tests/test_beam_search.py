"""Beam search (``pax_lm.inference.beam``, ``pax decode --beam-size``): a beam of one is greedy
decoding, a beam wide enough to hold every prefix finds what an exhaustive search of the
continuations (scored by full passes) finds, eos ends a hypothesis and the length penalty ranks
them, a search that ends early finds what searching on would; ``pax decode`` searches with it
and decodes with int8 weights."""

from __future__ import annotations

import importlib
import itertools
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_core import JobRequest, UsageError
from pax_core.testing import isolated_host, run_pax, train
from pax_lm import Batcher, BeamSearch, Engine, Request, SamplingSettings
from pax_lm.commands.decode import read_prompts
from pax_lm.commands.lm_jobs import restore_lm
from pax_transformer import TransformerLm

# Qwix 0.1.8 checks for flax's deprecated nnx.VariableState alias on every weight it reads.
pytestmark = pytest.mark.filterwarnings("ignore:'VariableState' was removed:DeprecationWarning")

VOCAB, MAX_LEN = 8, 32  # prompts up to 16 tokens and up to 31: two prefill buckets
ROWS = (64, 512)  # a full pass scores 64 rows or 512 (all 8**3 continuations): two programs


@pytest.fixture(scope="module")
def model():
    """A tiny random decoder (a scanned stack: its cache's rows are on axis 1) whose greedy
    continuations vary, and its variables."""
    decoder = TransformerLm(vocab_size=VOCAB, num_layers=2, model_dims=16, hidden_dims=32,
                            num_heads=2, max_seq_len=MAX_LEN, tied_embedding=False,
                            scan_layers=True)
    shapes = nn.unbox(jax.eval_shape(lambda: decoder.init(
        jax.random.PRNGKey(0), jnp.zeros((1, 4), jnp.int32))))
    rng = np.random.default_rng(2)

    def draw(path, shape):
        value = rng.normal(0.0, 0.3, shape.shape) + (path[-1].key == "scale")
        return jax.device_put(value.astype(shape.dtype))

    return decoder, {"params": jax.tree_util.tree_map_with_path(draw, shapes["params"])}


@pytest.fixture(scope="module")
def log_probs(model):
    """``[(prompt, continuation)] -> [log-probability of each continuation after its prompt]``,
    by full passes (no cache), every call one program."""
    decoder, variables = model
    forward = jax.jit(lambda ids: jax.nn.log_softmax(decoder.apply(variables, ids)))

    def score(pairs: list[tuple[list[int], list[int]]]) -> np.ndarray:
        ids = np.zeros((next(n for n in ROWS if n >= len(pairs)), MAX_LEN), np.int32)
        for row, (prompt, continuation) in enumerate(pairs):
            ids[row, :len(prompt) + len(continuation)] = [*prompt, *continuation]
        table = np.asarray(forward(ids))
        return np.asarray([sum(table[row, len(prompt) - 1 + i, token]
                               for i, token in enumerate(continuation))
                           for row, (prompt, continuation) in enumerate(pairs)])

    return score


def _prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, VOCAB, length).tolist()


PROMPTS = [_prompt(n, seed) for seed, n in enumerate([1, 5, 9, 14, 20, 25])]
NEW = 6  # tokens decoded after each of PROMPTS


@pytest.fixture(scope="module")
def greedy(log_probs) -> list[tuple[list[int], float]]:
    """Each of PROMPTS' greedy continuation and its log-probability, by full passes: each
    next token the one of the highest log-probability after the tokens so far."""
    found: list[list[int]] = [[] for _ in PROMPTS]
    for _ in range(NEW):
        scores = log_probs([(p, [*tokens, t]) for p, tokens in zip(PROMPTS, found, strict=True)
                            for t in range(VOCAB)]).reshape(len(PROMPTS), VOCAB)
        for tokens, row in zip(found, scores, strict=True):
            tokens.append(int(np.argmax(row)))
    return list(zip(found, log_probs(list(zip(PROMPTS, found, strict=True))), strict=True))


@pytest.fixture(scope="module")
def searches(model):
    """One ``BeamSearch`` a beam size the tests use, each compiling its programs once."""
    return {size: BeamSearch(*model, beam_size=size) for size in (1, 4, 64)}


def test_a_beam_of_one_is_greedy_decoding(searches, greedy):
    for prompt, (tokens, log_prob) in zip(PROMPTS, greedy, strict=True):
        [found] = searches[1].search(prompt, max_tokens=NEW)
        assert found.tokens == tokens
        assert found.finish_reason == "length" and found.score == found.log_prob
        np.testing.assert_allclose(found.log_prob, log_prob, atol=1e-4)
    assert len({tuple(tokens) for tokens, _ in greedy}) > 3  # the model does not say one thing


Found = list[tuple[list[int], float]]  # hypotheses as (tokens, log-probability)


def _ranked(hypotheses: Found, alpha: float = 0.0) -> list[tuple[list[int], float, float]]:
    """(tokens, log-probability, score) best score first: the log-probability over GNMT's
    length penalty, computed here from its definition."""
    scored = [(c, s, s / ((5 + len(c)) / 6) ** alpha) for c, s in hypotheses]
    return sorted(scored, key=lambda h: h[2], reverse=True)


def test_a_beam_holding_every_prefix_finds_the_best_continuations(searches, log_probs):
    prompt = PROMPTS[1]
    every = [list(c) for c in itertools.product(range(VOCAB), repeat=3)]
    exact = _ranked(list(zip(every, log_probs([(prompt, c) for c in every]), strict=True)))
    # 64 beams hold all 8 * 8 two-token prefixes, so the third step ranks every continuation.
    found = searches[64].search(prompt, max_tokens=3)
    assert [h.tokens for h in found] == [c for c, _, _ in exact[:64]]
    np.testing.assert_allclose([h.log_prob for h in found], [s for _, s, _ in exact[:64]],
                               atol=1e-4)
    assert found[0].log_prob > found[1].log_prob + 1e-3  # one best, not a tie


def _complete(eos: int, count: int) -> list[list[int]]:
    """Every hypothesis of at most ``count`` tokens: ended by eos (and by it only), or
    ``count`` tokens long without it."""
    words = [t for t in range(VOCAB) if t != eos]
    ended = [[*c, eos] for n in range(count) for c in itertools.product(words, repeat=n)]
    return ended + [list(c) for c in itertools.product(words, repeat=count)]


def test_eos_ends_a_hypothesis_and_the_length_penalty_ranks_them(searches, log_probs):
    prompt, eos = PROMPTS[1], 4
    every = _complete(eos, 3)  # 1 + 7 + 49 ended by eos, 343 by length
    scored = list(zip(every, log_probs([(prompt, c) for c in every]), strict=True))
    winners = []
    for alpha in (0.0, 3.0):
        exact = _ranked(scored, alpha)
        # 64 beams hold the 49 eos-free two-token prefixes: the third step ranks every
        # hypothesis.
        found = searches[64].search(prompt, max_tokens=3, length_norm_alpha=alpha, eos_id=eos)
        assert [h.tokens for h in found] == [c for c, _, _ in exact[:64]]
        np.testing.assert_allclose([h.log_prob for h in found], [s for _, s, _ in exact[:64]],
                                   atol=1e-4)
        for h in found:
            assert h.score == pytest.approx(h.log_prob / ((5 + len(h.tokens)) / 6) ** alpha)
            assert h.finish_reason == ("stop" if h.tokens[-1] == eos else "length")
            assert eos not in h.tokens[:-1]  # nothing follows eos
        assert {h.finish_reason for h in found} == {"stop", "length"}
        winners.append(found[0])
    # By log-probability eos alone leads; the penalty of alpha 3 puts a longer one first.
    assert winners[0].tokens == [eos] and len(winners[1].tokens) > 1


def _search_to_the_end(log_probs, prompt: list[int], beam_size: int, count: int, eos: int
                       ) -> tuple[Found, list[Found]]:
    """Beam search by full passes that never ends early: every hypothesis ended by eos (by
    log-probability), and the live beams after each step."""
    live: Found = [([], 0.0)]
    ended, steps = [], []
    for _ in range(count):
        grown = [[*tokens, t] for tokens, _ in live for t in range(VOCAB)]
        candidates = list(zip(grown, log_probs([(prompt, c) for c in grown]), strict=True))
        ended += [(c, s) for c, s in candidates if c[-1] == eos]
        live = sorted([(c, s) for c, s in candidates if c[-1] != eos], key=lambda h: -h[1])
        live = live[:beam_size]
        steps.append(live)
    return ended, steps


def _could_end_early(ended: Found, steps: list[Found], alpha: float) -> bool:
    """Whether a search of four beams could end before its last step: four hypotheses ended
    by then, the worst of them above the best score the live beams could still reach."""
    for step, live in enumerate(steps[:-1], 1):
        kept = _ranked([(c, s) for c, s in ended if len(c) <= step], alpha)
        if len(kept) >= 4 and live[0][1] / ((5 + NEW) / 6) ** alpha <= kept[3][2]:
            return True
    return False


def test_a_search_ends_early_only_when_nothing_live_can_beat_the_finished(searches, log_probs):
    ended_early = 0
    for prompt, eos in itertools.product(PROMPTS[:4], (1, 4)):
        ended, steps = _search_to_the_end(log_probs, prompt, 4, NEW, eos)
        for alpha in (0.0, 2.0):
            expected = _ranked(ended + steps[-1], alpha)[:4]
            found = searches[4].search(prompt, max_tokens=NEW, length_norm_alpha=alpha,
                                       eos_id=eos)
            assert [h.tokens for h in found] == [c for c, _, _ in expected]
            np.testing.assert_allclose([h.score for h in found], [s for _, _, s in expected],
                                       atol=1e-4)
            ended_early += _could_end_early(ended, steps, alpha)
    assert ended_early >= 2, ended_early  # the early end is exercised


def test_wider_beams_never_score_below_greedy_and_compile_once(searches, greedy, log_probs):
    search = searches[4]
    found = [search.search(prompt, max_tokens=NEW)[0] for prompt in PROMPTS]
    np.testing.assert_allclose([h.log_prob for h in found], log_probs(
        [(p, h.tokens) for p, h in zip(PROMPTS, found, strict=True)]), atol=1e-4)
    # Not a theorem (a wider beam may drop greedy's path for others that end worse), but on
    # these prompts four beams keep it or find better.
    gains = [h.log_prob - log_prob for h, (_, log_prob) in zip(found, greedy, strict=True)]
    assert min(gains) > -1e-5 and max(gains) > 1e-2, gains
    # Other lengths, alphas and eos ids: the same programs, one prefill a bucket.
    search.search(PROMPTS[0], max_tokens=2, length_norm_alpha=0.6, eos_id=3)
    assert search.compilations() == {"prefill": 2, "step": 1}


def test_what_beam_search_refuses(model, searches):
    with pytest.raises(UsageError, match=r"^the beam size must be >= 1, got 0$"):
        BeamSearch(*model, beam_size=0)
    search = searches[1]
    for prompt, kwargs, message in [
            ([], {}, "the prompt is empty"),
            ([1] * MAX_LEN, {}, "the prompt is 32 tokens long; this model's maximum length "
                                "is 32, so the prompt must be at most 31 tokens"),
            ([1], {"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
            ([1], {"length_norm_alpha": -0.5}, "length_norm_alpha must be >= 0, got -0.5")]:
        with pytest.raises(UsageError, match=f"^{message}$"):
            search.search(prompt, **{"max_tokens": 4, **kwargs})


@pytest.fixture(scope="module")
def host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")),
                         ("transformer", importlib.import_module("pax_transformer.plugin")))


@pytest.fixture(scope="module")
def job(host, tmp_path_factory):
    job_dir = tmp_path_factory.mktemp("beam_job")
    train(host, exp="TinyLmForTests", plugin="lm", job_dir=str(job_dir), evaluate=False,
          set_items=["NUM_TRAIN_STEPS=2", "CHECKPOINT_EVERY_N_STEPS=2"])
    return job_dir


@pytest.fixture(scope="module")
def restored(host, job):
    """The job's tokenizer, decoder and variables (float), restored as ``pax decode`` restores
    them."""
    _, tokenizer, decoder, variables = restore_lm(
        JobRequest(host, str(job), None, None, [], None, None))
    return tokenizer, decoder, variables


TEXTS = ["And God said", "In the begin", "The LORD is"]  # with bos, one prefill bucket


def _decoded(tmp_path, job, *options: str) -> list[dict]:
    """``pax decode --prompts`` of TEXTS, 8 tokens at most: the output's lines."""
    prompts, output = tmp_path / "prompts.jsonl", tmp_path / "out.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in TEXTS))
    result = run_pax("decode", "--job-dir", str(job), "--prompts", str(prompts), "--output",
                     str(output), "--max-tokens", "8", *options)
    assert result.returncode == 0, result.stderr
    assert f"3 completions -> {output}" in result.stdout
    return [json.loads(line) for line in output.read_text().splitlines()]


def test_pax_decode_beam_size_writes_the_best_hypothesis_int8_too(job, restored, tmp_path):
    tokenizer, decoder, variables = restored
    got = _decoded(tmp_path, job, "--beam-size", "3", "--length-norm-alpha", "0.6",
                   "--quantize", "int8")
    search = BeamSearch(decoder, variables, beam_size=3)  # float weights
    same = 0
    for text, line in zip(TEXTS, got, strict=True):
        best = search.search([tokenizer.bos_id, *tokenizer.encode(text)], 8, 0.6,
                             tokenizer.eos_id)[0]
        words = best.tokens[:-1] if best.finish_reason == "stop" else best.tokens
        assert set(line) == {"prompt", "completion", "tokens", "finish_reason", "score"}
        assert line["prompt"] == text and line["tokens"] <= 8
        assert (line["finish_reason"] == "length") == (line["tokens"] == 8)
        # The int8 weights are in use: the score is close to float's, not equal to it.
        assert line["score"] != pytest.approx(best.score, abs=1e-4)
        assert line["score"] == pytest.approx(best.score, rel=0.02)
        same += line["completion"] == tokenizer.decode(words)
    assert same >= 2 and any(line["tokens"] for line in got)


def test_pax_decode_quantize_int8_mostly_decodes_as_float(job, restored, tmp_path):
    tokenizer, decoder, variables = restored
    got = _decoded(tmp_path, job, "--quantize", "int8")
    requests = [Request([tokenizer.bos_id, *tokenizer.encode(t)],
                        SamplingSettings(max_tokens=8, stop_ids=(tokenizer.eos_id,)))
                for t in TEXTS]
    full = [tokenizer.decode(done.tokens) for done in Batcher(
        Engine(decoder, variables, slots=3)).run(requests)]
    int8 = [line["completion"] for line in got]
    same = sum(a == b for q, f in zip(int8, full, strict=True) for a, b in zip(q, f, strict=False))
    assert same >= 0.75 * sum(map(len, full)) > 0, (int8, full)


def test_pax_decode_refuses_sampling_with_a_beam(job, tmp_path):
    refused = run_pax("decode", "--job-dir", str(job), "--prompt", "And", "--beam-size", "2",
                      "--temperature", "0.5")
    assert refused.returncode == 2
    assert refused.stderr == ("pax: error: --beam-size searches for the likeliest continuation "
                              "and draws nothing: leave out --temperature, or decode without "
                              "--beam-size\n")
    # A line asking to sample, with --beam-size: refused before anything is restored.
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "And"}\n{"prompt": "The", "top_k": 5, "stop": ["x"]}\n')
    assert len(read_prompts(prompts, SamplingSettings())) == 2
    with pytest.raises(UsageError, match=f"^{prompts}:2: beam search \\(--beam-size\\) takes "
                                         f"no top_k, stop; remove it from the line"):
        read_prompts(prompts, SamplingSettings(), searched=True)
