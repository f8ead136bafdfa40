"""Int8 weights (``pax_lm.quantization``, ``pax score --quantize int8``): on a trained model the
held-out log-perplexity stays within 0.02 of float, the projection kernels take a quarter of
their float32 bytes, greedy predictions mostly agree, the KV-cached decode path gives what a
full pass gives, a scanned stack quantizes layer by layer as a looped one does, and an unknown
mode is a usage error."""

from __future__ import annotations

import importlib
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_core import JobRequest, UsageError
from pax_core.testing import isolated_host, run_pax, train
from pax_lm.corpus import default_corpus
from pax_lm.inputs.text import split_documents
from pax_lm.models import LanguageModel
from pax_lm.quantization import quantize, weight_bytes
from pax_lm.scoring import Scorer
from pax_lm.tokenizers import ByteTokenizer

# Qwix 0.1.8 checks for flax's deprecated nnx.VariableState alias on every weight it reads.
pytestmark = pytest.mark.filterwarnings("ignore:'VariableState' was removed:DeprecationWarning")

STEPS = 40
PROJECTIONS = [("attention", n) for n in ("query", "key", "value", "out")] + [
    ("ffn", "wi"), ("ffn", "wo")]


@pytest.fixture(scope="module")
def host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")))


@pytest.fixture(scope="module")
def job(host, tmp_path_factory):
    job_dir = tmp_path_factory.mktemp("int8")
    train(host, exp="TinyLmForTests", plugin="lm", set_items=[f"NUM_TRAIN_STEPS={STEPS}"],
          job_dir=str(job_dir), evaluate=False)
    return job_dir


@pytest.fixture(scope="module")
def trained(host, job):
    """The trained decoder and its variables, as ``pax score`` restores them, float and int8."""
    restored = JobRequest(host, str(job), None, None, [], None, None).restore(
        LanguageModel, "a language model")
    variables = {name: collection["decoder"] for name, collection
                 in restored.variables().items() if "decoder" in collection}
    decoder = restored.model.decoder
    return (decoder, variables), quantize(decoder, variables, "int8")


def heldout_requests(length: int, count: int) -> list[tuple[list[int], list[int]]]:
    """``count`` held-out chunks of ``length`` bytes each, scored after ``bos``."""
    tokenizer = ByteTokenizer()
    text = "\n".join(split_documents(default_corpus(), "eval", 0.02))
    ids = tokenizer.encode(text)
    return [([tokenizer.bos_id], ids[i * length:(i + 1) * length]) for i in range(count)]


def log_perplexity(decoder, variables, requests) -> float:
    scores = Scorer(decoder, variables, batch_size=16).score(requests)
    return -sum(s.log_likelihood for s in scores) / sum(s.num_tokens for s in scores)


def test_int8_keeps_the_heldout_log_perplexity(trained):
    (decoder, _), _ = trained
    requests = heldout_requests(decoder.max_seq_len - 1, 64)  # about 2000 held-out tokens
    full, int8 = (log_perplexity(d, v, requests) for d, v in trained)
    assert full < 4.0  # it learned: uniform over bytes is 5.56
    assert int8 != full  # the int8 weights are in use
    assert abs(int8 - full) < 0.02, (full, int8)


def test_int8_kernels_take_a_quarter_of_the_bytes_and_the_embedding_stays_float(trained):
    (decoder, variables), (_, qvariables) = trained
    floats = nn.unbox(variables["params"])
    layer = qvariables["params"]["stack"]["layer_0"]
    assert all(layer[part][name]["kernel"].array.qvalue.dtype == jnp.int8
               for part, name in PROJECTIONS)
    wi = layer["ffn"]["wi"]["kernel"].array  # one scale per output channel, within half a step
    assert wi.scale.shape == (1, decoder.hidden_dims)
    step = np.asarray(wi.scale)
    error = np.abs(np.asarray(wi.qvalue, np.float32) * step
                   - np.asarray(floats["stack"]["layer_0"]["ffn"]["wi"]["kernel"]))
    assert np.all(error <= step / 2 + 1e-7)
    float_kernels, int8_kernels = (
        sum(weight_bytes(tree["stack"][f"layer_{i}"][part][name]["kernel"])
            for i in range(decoder.num_layers) for part, name in PROJECTIONS)
        for tree in (floats, qvariables["params"]))
    assert 0.25 <= int8_kernels / float_kernels < 0.27, int8_kernels / float_kernels
    embedding = qvariables["params"]["embedding"]["embedding"]
    assert embedding.dtype == jnp.float32
    np.testing.assert_array_equal(embedding, floats["embedding"]["embedding"])
    assert weight_bytes(qvariables["params"]) < 0.45 * weight_bytes(floats)


def test_greedy_predictions_mostly_agree(trained):
    (decoder, variables), (qdecoder, qvariables) = trained
    rows = np.asarray([[ByteTokenizer().bos_id, *c] for _, c in
                       heldout_requests(decoder.max_seq_len - 1, 32)], np.int32)
    full = np.argmax(decoder.apply(variables, rows), -1)
    int8 = np.argmax(qdecoder.apply(qvariables, rows), -1)
    assert np.mean(full == int8) > 0.95, np.mean(full == int8)


def greedy(decoder, variables, prompt: np.ndarray, steps: int) -> np.ndarray:
    """``steps`` greedy tokens after ``prompt`` [B, T] through the KV cache."""
    cache = decoder.init(jax.random.PRNGKey(0), prompt[:, :1], decode=True)["cache"]
    logits, mutated = decoder.apply({**variables, "cache": cache}, prompt, decode=True,
                                    mutable=["cache"])
    tokens = [jnp.argmax(logits[:, -1], -1)]
    for _ in range(steps - 1):
        logits, mutated = decoder.apply({**variables, "cache": mutated["cache"]},
                                        tokens[-1][:, None], decode=True, mutable=["cache"])
        tokens.append(jnp.argmax(logits[:, -1], -1))
    return np.stack(tokens, 1)


def test_the_kv_cached_decode_path_runs_with_int8(trained):
    (decoder, variables), (qdecoder, qvariables) = trained
    tokenizer = ByteTokenizer()
    prompt = np.asarray([[tokenizer.bos_id, *tokenizer.encode(p)] for p in
                         ("And God said", "In the begin", "The LORD is ")], np.int32)
    tokens = greedy(qdecoder, qvariables, prompt, 12)
    whole = np.concatenate([prompt, tokens], 1)
    full_pass = np.argmax(qdecoder.apply(qvariables, whole[:, :-1]), -1)[:, prompt.shape[1] - 1:]
    np.testing.assert_array_equal(tokens, full_pass)  # the cache computes what a pass does
    assert np.mean(tokens == greedy(decoder, variables, prompt, 12)) > 0.8


def test_a_scanned_stack_quantizes_each_layer_as_a_looped_one():
    import fiddle as fdl

    from pax_lm.experiments.quickstart import TinyLmForTests
    from pax_transformer import stack_layer_params

    looped = fdl.build(TinyLmForTests().decoder())
    scanned = looped.clone(scan_layers=True)
    ids = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, looped.vocab_size)
    params = nn.unbox(looped.init(jax.random.PRNGKey(0), ids)["params"])
    stacked = {**params, "stack": stack_layer_params(params["stack"])}
    qlooped, qlooped_vars = quantize(looped, {"params": params}, "int8")
    qscanned, qscanned_vars = quantize(scanned, {"params": stacked}, "int8")
    scales = qscanned_vars["params"]["stack"]["layers"]["ffn"]["wi"]["kernel"].array.scale
    assert scales.shape == (looped.num_layers, 1, looped.hidden_dims)  # one set per layer
    np.testing.assert_allclose(qscanned.apply(qscanned_vars, ids),
                               qlooped.apply(qlooped_vars, ids), atol=1e-5)


def test_an_unknown_mode_and_an_fp8_decoder_are_refused(trained):
    (decoder, variables), _ = trained
    with pytest.raises(UsageError, match=r"^--quantize must be one of none, int8, got 'int4'$"):
        quantize(decoder, variables, "int4")
    with pytest.raises(UsageError, match=r"^--quantize int8 runs a decoder trained without fp8"):
        quantize(decoder.clone(fp8=True), variables, "int8")
    assert quantize(decoder, variables, "none") == (decoder, variables)


@pytest.mark.slow
def test_pax_score_quantize_int8(job, tmp_path):
    requests = tmp_path / "requests.jsonl"
    rows = [{"context": "And God said", "continuation": " Let there be light"},
            {"context": "In the beginning", "continuation": " God created"}]
    requests.write_text("".join(json.dumps(r) + "\n" for r in rows))
    scored = {}
    for mode in ("none", "int8"):
        out = tmp_path / f"{mode}.jsonl"
        result = run_pax("score", "--job-dir", str(job), str(requests), "--output", str(out),
                         "--quantize", mode)
        assert result.returncode == 0, result.stderr
        scored[mode] = [json.loads(line)["log_likelihood"] for line in
                        out.read_text().splitlines()]
    assert scored["int8"] != scored["none"]
    np.testing.assert_allclose(scored["int8"], scored["none"], rtol=0.02)
    refused = run_pax("score", "--job-dir", str(job), str(requests), "--quantize", "int4")
    assert refused.returncode == 2
    assert "'int4' is not one of 'none', 'int8'" in refused.stderr
