"""A language-model job from Python: trained with ``pax_core.train``, loaded with
``pax_lm.load``; its ``generate`` gives what the engine's ``Batcher`` gives for the same prompts
(greedy, sampled, with stop strings, in any batch size), ``beam_search`` what ``beam_search``
finds and ``score`` what the ``Scorer`` scores; mistakes are ``UsageError``s naming them."""

from __future__ import annotations

import dataclasses

import pytest

import pax_core
import pax_lm
from pax_core import UsageError
from pax_lm import Batcher, Engine, Request, SamplingSettings, Scorer
from pax_lm.scoring import encode_pair

PROMPTS = ["And God said", "In the beginning God created", "And", "The LORD"]


@pytest.fixture(scope="module")
def job_dir(tmp_path_factory):
    job_dir = tmp_path_factory.mktemp("lm_python_api")
    result = pax_core.train("TinyLmForTests", job_dir, plugin="lm",
                            overrides={"NUM_TRAIN_STEPS": 2, "EVAL_INTERVAL_STEPS": 1000})
    assert result.step == 2 and result.loss is not None
    return job_dir


@pytest.fixture(scope="module")
def reference(job_dir):
    """The job as any loaded job (``pax_core.load``): the decoder, its variables and the
    tokenizer, for the engine, the search and the scorer driven by hand."""
    job = pax_core.load(job_dir)
    decoder = job.model.decoder
    variables = {name: value["decoder"] for name, value in job.variables().items()}
    return decoder, variables, job.run.train_input.tokenizer


@pytest.fixture(scope="module")
def lm(job_dir):
    return pax_lm.load(job_dir)


def _by_batcher(reference, engine, prompts: list[str], settings: SamplingSettings
                ) -> list[str]:
    _, _, tokenizer = reference
    settings = dataclasses.replace(settings, stop_ids=(tokenizer.eos_id,))
    requests = [Request([tokenizer.bos_id, *tokenizer.encode(p)], settings) for p in prompts]
    return [done.text for done in Batcher(engine, tokenizer.decode).run(requests)]


def test_generate_is_what_the_batcher_gives(lm, reference):
    assert (lm.step, lm.experiment) == (2, "lm/TinyLmForTests")
    decoder, variables, _ = reference
    engine = Engine(decoder, variables, slots=1)  # one prompt at a time: nothing beside it
    greedy = lm.generate(PROMPTS, max_tokens=10, batch_size=2)
    assert greedy == _by_batcher(reference, engine, PROMPTS, SamplingSettings(max_tokens=10))
    assert len(set(greedy)) > 1  # the prompts' continuations are their own
    sampled = SamplingSettings(max_tokens=12, temperature=0.8, top_k=20, top_p=0.9, seed=3,
                               stop=("e",))
    drawn = lm.generate(PROMPTS, max_tokens=12, temperature=0.8, top_k=20, top_p=0.9, seed=3,
                        stop=["e"], batch_size=2)
    assert drawn == _by_batcher(reference, engine, PROMPTS, sampled)
    assert drawn != lm.generate(PROMPTS, max_tokens=12, temperature=0.8, top_k=20, top_p=0.9,
                                seed=4, stop=["e"], batch_size=2)
    assert lm.generate(PROMPTS[1], max_tokens=10, batch_size=2) == [greedy[1]]
    assert lm.tokenizer.decode(lm.tokenizer.encode("And God")) == "And God"


def test_beam_search_is_what_the_search_finds(lm, reference):
    decoder, variables, tokenizer = reference
    found = lm.beam_search(PROMPTS[0], beam_size=3, max_tokens=6, length_norm_alpha=0.6)
    expected = pax_lm.beam_search(decoder, variables,
                                  [tokenizer.bos_id, *tokenizer.encode(PROMPTS[0])], 3, 6, 0.6,
                                  tokenizer.eos_id)
    assert [f.score for f in found] == [h.score for h in expected]
    for f, h in zip(found, expected, strict=True):
        tokens = h.tokens[:-1] if h.finish_reason == "stop" else h.tokens
        assert (f.tokens, f.text, f.finish_reason) == (tokens, tokenizer.decode(tokens),
                                                       h.finish_reason)


def test_score_is_what_the_scorer_scores(lm, reference):
    decoder, variables, tokenizer = reference
    pairs = [("And God said", " Let there be light"), ("In the beginning", " God created"),
             ("The LORD", " is my shepherd")]
    scores = lm.score(pairs, batch_size=2)
    expected = Scorer(decoder, variables, 4).score([encode_pair(tokenizer, *p) for p in pairs])
    assert scores == expected
    assert len({s.log_likelihood for s in scores}) == 3


def test_mistakes_are_usage_errors(lm, job_dir):
    with pytest.raises(UsageError, match=r"^temperature must be >= 0"):
        lm.generate(PROMPTS, temperature=-1.0)
    with pytest.raises(UsageError, match=r"^prompt 2: the prompt is \d+ tokens long"):
        lm.generate(["And", "x" * 40])
    with pytest.raises(UsageError, match=r"^pair 1: expected \(context, continuation\)"):
        lm.score([("only a context",)])
    with pytest.raises(UsageError, match="quantize must be one of"):
        pax_lm.load(job_dir, quantize="int4")
    int8 = pax_lm.load(job_dir, quantize="int8")
    assert len(int8.generate(PROMPTS[:1], max_tokens=4)) == 1
    with pytest.raises(UsageError, match="loaded with quantize='int8'"):
        int8.variables()
