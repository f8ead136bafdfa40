"""The LM modality end to end: it learns real text, decodes with its cache, and reports bad
input in one line."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import fiddle as fdl
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_core import UsageError
from pax_core.testing import isolated_host, train
from pax_lm.decoding import SamplingSettings, filter_logits
from pax_lm.experiments.quickstart import TinyLmForTests
from pax_lm.inference import generate

PAX = Path(sys.executable).with_name("pax")


@pytest.fixture(scope="module")
def host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")),
                         ("transformer", importlib.import_module("pax_transformer.plugin")))


@pytest.fixture(scope="module")
def trained_job(host, tmp_path_factory):
    job_dir = tmp_path_factory.mktemp("tiny_lm")
    train(host, exp="TinyLmForTests", plugin="lm", set_items=[], job_dir=str(job_dir))
    return job_dir


def _records(job_dir: Path, kind: str) -> list[dict]:
    lines = (job_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_tiny_lm_learns_real_text(trained_job):
    train = _records(trained_job, "train")
    uniform = math.log(259)  # the loss of a model that knows nothing about bytes
    assert train[-1]["loss"] < 0.5 * uniform
    assert train[-1]["loss"] < train[0]["loss"] - 0.5
    assert {"log_pplx", "fraction_of_correct_next_step_preds", "num_predictions",
            "tokens_per_sec"} <= set(train[-1])
    heldout = _records(trained_job, "eval/heldout")
    assert heldout[-1]["log_pplx"] < heldout[0]["log_pplx"]


def test_quick_start_model_learns_within_a_test_budget(host, tmp_path):
    train(host, exp="QuickStartLm", plugin="lm", job_dir=str(tmp_path), set_items=[
        "NUM_TRAIN_STEPS=30", "SUMMARY_INTERVAL_STEPS=10", "LR_COS_WARMUP=5",
        "LR_COS_DECAY_START=5", "EVAL_INTERVAL_STEPS=1000"])
    losses = [r["loss"] for r in _records(tmp_path, "train")]
    assert len(losses) == 3
    assert losses[-1] < losses[0] < math.log(259)
    assert losses[-1] < 0.6 * math.log(259)


def _decoder_and_params(seed: int = 0):
    decoder = fdl.build(TinyLmForTests().decoder())
    params = decoder.init(jax.random.PRNGKey(seed), jnp.zeros((1, 8), jnp.int32))["params"]
    return decoder, params


def test_cached_greedy_decoding_equals_argmax_over_full_passes():
    decoder, params = _decoder_and_params()
    prompt = [1, 40, 50, 60]
    tokens = generate(decoder, {"params": params}, prompt, SamplingSettings(max_tokens=10))
    # The decoder is causal, so one full pass over the result gives every prefix's logits.
    logits = decoder.apply({"params": params}, jnp.asarray([prompt + tokens]))
    greedy = jnp.argmax(logits[0, len(prompt) - 1:-1], axis=-1).tolist()
    assert len(tokens) == 10
    assert tokens == greedy


def test_sampling_is_seeded_and_stays_in_top_k():
    decoder, params = _decoder_and_params(1)
    settings = SamplingSettings(max_tokens=8, temperature=1.0, top_k=3, seed=7)
    first = generate(decoder, {"params": params}, [1, 70], settings)
    assert first == generate(decoder, {"params": params}, [1, 70], settings)
    assert len(first) == 8


def _kept(filtered) -> list[bool]:
    return np.isfinite(np.asarray(filtered)).tolist()[0]


def test_top_k_and_top_p_keep_the_likeliest_tokens():
    logits = jnp.log(jnp.asarray([[0.5, 0.3, 0.15, 0.05]]))
    assert _kept(filter_logits(logits, top_k=2, top_p=1.0)) == [True, True, False, False]
    assert _kept(filter_logits(logits, top_k=0, top_p=0.7)) == [True, True, False, False]
    assert _kept(filter_logits(logits, top_k=0, top_p=0.85)) == [True, True, True, False]


def test_prompt_longer_than_the_model_is_refused():
    decoder, params = _decoder_and_params()
    with pytest.raises(UsageError, match="maximum length is 32"):
        generate(decoder, {"params": params}, list(range(3, 40)), SamplingSettings())


def _pax(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PAX_STRICT_PLUGINS": "1"}
    return subprocess.run([str(PAX), *args], capture_output=True, text=True, timeout=120,
                          env=env)


def test_pax_decode_continues_a_prompt(trained_job):
    result = _pax("decode", "--plugin", "lm", "--job-dir", str(trained_job),
                  "--prompt", "And God said", "--max-decode-steps", "20")
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip().splitlines()[-1]
    assert line.startswith("[step 60] And God said")
    assert len(line) > len("[step 60] And God said")
    too_long = _pax("decode", "--job-dir", str(trained_job), "--prompt", "x" * 40)
    assert too_long.returncode == 2
    assert "maximum length is 32" in too_long.stderr
    assert "Traceback" not in too_long.stderr


BAD_INPUTS = [
    ("CORPUS_PATH='/nonexistent/corpus'", "no such file or folder: /nonexistent/corpus"),
    ("datasets[0].tokenizer=3", "tokenizer"),
]


def test_bad_input_is_one_clear_line(tmp_path):
    """Through the ``pax`` command; every bad input is the next tests'."""
    item, message = BAD_INPUTS[0]
    result = _pax("train", "--exp", "TinyLmForTests", "--job-dir", str(tmp_path / "job"),
                  "--set", item)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "job").exists()


def _refused_here(host, job: Path, item: str) -> str:
    """``pax train`` in this process: the usage error (exit 2) that the command prints as its
    one line (the test above), nothing written."""
    with pytest.raises(UsageError) as refused:
        train(host, exp="TinyLmForTests", plugin="lm", set_items=[item], job_dir=str(job))
    assert "\n" not in str(refused.value) and refused.value.exit_code == 2
    assert not job.exists()
    return str(refused.value)


@pytest.mark.parametrize(("item", "message"), BAD_INPUTS, ids=["no-corpus", "tokenizer"])
def test_each_bad_input_is_refused_before_anything_is_written(host, tmp_path, capfd, item,
                                                              message):
    assert message in _refused_here(host, tmp_path / "job", item)
    assert capfd.readouterr().err == ""


def test_empty_corpus_is_one_clear_line(host, tmp_path, capfd):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "a.txt").write_text("  \n")
    message = _refused_here(host, tmp_path / "job", f"CORPUS_PATH='{tmp_path / 'empty'}'")
    assert f"no text in {tmp_path / 'empty'}" in message
    assert capfd.readouterr().err == ""
