"""Scoring (`pax score`): a continuation's log-likelihood is what the training loss counts for
its tokens, whatever the batching; greedy continuations are recognised; long contexts are cut
on the left; one program compiles per bucket; bad requests are one line, exit 2, nothing
written."""

from __future__ import annotations

import importlib
import json

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_core import UsageError
from pax_core.testing import isolated_host, run_pax, train
from pax_lm.experiments.quickstart import TinyLmForTests
from pax_lm.models import LanguageModel
from pax_lm.scoring import Scorer, bucket, encode_pair
from pax_lm.tokenizers import ByteTokenizer


@pytest.fixture(scope="module")
def model():
    decoder = fdl.build(TinyLmForTests().decoder())  # max_seq_len 32
    params = decoder.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
    return decoder, {"params": params}


def _loss_sum(decoder, variables, tokens: list[int], scored: int) -> float:
    """The training loss's cross-entropy summed over the last ``scored`` predictions of one
    row: ``LanguageModel``'s mean times its count."""
    weights = np.zeros((1, len(tokens) - 1), np.float32)
    weights[0, len(tokens) - 1 - scored:] = 1
    batch = {"ids": np.asarray([tokens[:-1]], np.int32),
             "labels": np.asarray([tokens[1:]], np.int32), "weights": weights}
    out = LanguageModel(decoder).apply({"params": {"decoder": variables["params"]}}, batch)
    return float(out.loss) * scored


REQUESTS = [([1, 40, 50], [60]), ([1, 7], [8, 9, 10, 11]), ([1, *range(20, 40)], [41, 42]),
            ([1, 5, 6, 7, 8], [9, 10, 11]), ([1], [100, 101, 102, 103, 104, 105])]


def test_scores_are_the_training_losses_per_token_log_probabilities(model):
    decoder, variables = model
    scores = Scorer(decoder, variables, batch_size=2).score(REQUESTS)
    for (context, continuation), s in zip(REQUESTS, scores, strict=True):
        expected = -_loss_sum(decoder, variables, context + continuation, len(continuation))
        np.testing.assert_allclose(s.log_likelihood, expected, rtol=1e-5)
        assert (s.num_tokens, s.truncated) == (len(continuation), False)
    alone = [Scorer(decoder, variables, batch_size=1).score([r])[0] for r in REQUESTS]
    np.testing.assert_allclose([s.log_likelihood for s in alone],
                               [s.log_likelihood for s in scores], rtol=1e-5)


def test_greedy_continuations_are_recognised(model):
    decoder, variables = model
    tokens = [1, 30, 31]
    for _ in range(4):  # greedy decoding by full passes
        logits = decoder.apply(variables, jnp.asarray([tokens], jnp.int32))
        tokens.append(int(jnp.argmax(logits[0, -1])))
    greedy = tokens[3:]
    other = [*greedy[:2], (greedy[2] + 1) % 259, greedy[3]]
    first, second = Scorer(decoder, variables).score([([1, 30, 31], greedy),
                                                      ([1, 30, 31], other)])
    assert first.is_greedy and not second.is_greedy
    assert first.log_likelihood > second.log_likelihood


def test_one_program_per_bucket(model):
    decoder, variables = model
    scorer = Scorer(decoder, variables, batch_size=2)
    scorer.score(REQUESTS)  # rows of 4 to 22 inputs: buckets 16 and 32
    scorer.score(list(reversed(REQUESTS)) + REQUESTS[:1])
    assert scorer._scores._cache_size() == 2
    assert [bucket(n, 32) for n in (1, 16, 17, 32, 40)] == [16, 16, 32, 32, 32]


def test_a_long_context_is_cut_on_the_left_and_a_long_continuation_refused(model):
    decoder, variables = model
    context, continuation = [1, *range(10, 50)], [60, 61, 62]
    [cut] = Scorer(decoder, variables).score([(context, continuation)])
    kept = context[-(33 - len(continuation)):]  # 33 tokens make the 32 inputs of the model
    assert cut.truncated
    np.testing.assert_allclose(
        cut.log_likelihood, -_loss_sum(decoder, variables, kept + continuation, 3), rtol=1e-5)
    with pytest.raises(UsageError, match=r"^request 2: the continuation is 33 tokens; this "
                                         r"model scores at most 32 at once$"):
        Scorer(decoder, variables).score([([1], [5]), ([1], list(range(33)))])


def test_the_continuation_is_tokenized_as_part_of_the_whole_text():
    tokenizer = ByteTokenizer()
    context, continuation = encode_pair(tokenizer, "And God", " said")
    assert context == [tokenizer.bos_id, *tokenizer.encode("And God")]
    assert continuation == tokenizer.encode(" said")


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    host = isolated_host(("lm", importlib.import_module("pax_lm.plugin")))
    job_dir = tmp_path_factory.mktemp("scored")
    train(host, exp="TinyLmForTests", plugin="lm", set_items=["NUM_TRAIN_STEPS=2"],
          job_dir=str(job_dir))
    return job_dir


@pytest.mark.slow
def test_pax_score_writes_one_line_a_request_and_refuses_bad_ones(job, tmp_path):
    requests = tmp_path / "requests.jsonl"
    rows = [{"context": "And God said", "continuation": " Let"},
            {"context": "In the beginning", "continuation": " God created"}]
    requests.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "scores.jsonl"
    result = run_pax("score", "--job-dir", str(job), str(requests), "--output", str(out))
    assert result.returncode == 0, result.stderr
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(s["context"], s["continuation"]) for s in scored] == [
        (r["context"], r["continuation"]) for r in rows]
    assert [s["tokens"] for s in scored] == [4, 12]
    assert all(s["log_likelihood"] < 0 and s["truncated"] is False for s in scored)
    printed = run_pax("score", "--job-dir", str(job), str(requests))
    assert printed.returncode == 0, printed.stderr
    assert [json.loads(line) for line in printed.stdout.splitlines()] == scored

    again = run_pax("score", "--job-dir", str(job), str(requests), "--output", str(out))
    assert again.returncode == 2 and f"--output {out} exists; pass --overwrite" in again.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"context": "x"}) + "\n")
    refused = run_pax("score", "--job-dir", str(job), str(bad), "--output",
                      str(tmp_path / "none.jsonl"))
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith(f"pax: error: {bad}:2: each line is ")
    assert refused.stderr.count("\n") == 1 and not (tmp_path / "none.jsonl").exists()
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps(rows[0]) + "\n" + json.dumps({"context": "a",
                                                            "continuation": "b" * 40}) + "\n")
    too_long = run_pax("score", "--job-dir", str(job), str(long))
    assert too_long.returncode == 2, too_long.stderr
    assert too_long.stderr == (f"pax: error: {long}:2: the continuation is 40 tokens; this "
                               f"model scores at most 32 at once\n")
