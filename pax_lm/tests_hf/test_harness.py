"""`pax eval --harness` through EleutherAI's lm-evaluation-harness (pax-lm's `harness` extra),
offline: the tasks are YAML files the tests write over local JSONL files, evaluated on a tiny
LM trained 40 steps (enough to write more than one letter). The adapter's answers are checked
against Pax's own operations: a multiple-choice task's log-likelihoods against the Scorer
(`pax score`), a rolling-perplexity task's against per-token log-probabilities of full passes
(a document longer than the model too), a generation task's against the decoding engine's
greedy continuation cut at `until`; then the command end to end, a task lm-eval does not know
and a task whose data is missing."""

from __future__ import annotations

import functools
import importlib
import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_core import JobRequest, RunError, UsageError
from pax_core.testing import isolated_host, run_pax, train
from pax_lm.decoding import SamplingSettings
from pax_lm.inference import Batcher, Engine, Request
from pax_lm.scoring import Scorer, encode_pair

pytest.importorskip("lm_eval")
from lm_eval.api.registry import get_model
from lm_eval.evaluator import simple_evaluate
from lm_eval.tasks import TaskManager

from pax_lm.harness import evaluate
from pax_lm.harness_model import sampling_settings

# One worker runs them all (the hf session distributes by group), so the job trains once.
pytestmark = pytest.mark.xdist_group("harness")

QUESTIONS = [
    {"question": "And God said, Let there be", "choices": ["light", "zebra", "qqqq"],
     "answer": 0},
    {"question": "In the beginning God created the", "choices": ["heaven", "xylophone"],
     "answer": 0},
    {"question": "And the evening and the morning were the first", "choices": ["day", "car"],
     "answer": 0},
    {"question": "And God saw the light, that it was", "choices": ["good", "blue", "late"],
     "answer": 0},
    {"question": "The LORD is my", "choices": ["shepherd", "spoon"], "answer": 0},
]
DOCUMENTS = [  # the model reads 32 tokens (bytes) at once: the second takes five windows
    {"text": "And God said, Let there be light."},
    {"text": "And the earth was without form, and void; and darkness was upon the face of the "
             "deep. And the Spirit of God moved upon the face of the waters."},
]
PROMPTS = [{"prompt": "And God said", "target": ","}, {"prompt": "In the beginning", "target": ""},
           {"prompt": "And the evening", "target": " and"},
           # longer than the 24 tokens left beside 8 generated ones: its start is cut
           {"prompt": "And the earth was without form, and void", "target": ";"}]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    host = isolated_host(("lm", importlib.import_module("pax_lm.plugin")))
    job_dir = tmp_path_factory.mktemp("harness_job")
    train(host, exp="TinyLmForTests", plugin="lm", set_items=["NUM_TRAIN_STEPS=40"],
          job_dir=str(job_dir))
    return job_dir


@pytest.fixture(scope="module")
def model(job):
    """The adapter as lm-eval's registry makes it (``model_args``): the job restored, four
    requests at a time."""
    return get_model("pax").create_from_arg_obj({"job_dir": str(job)}, {"batch_size": 4})


def write_task(folder, name: str, rows: list[dict], **config) -> str:
    """A task of lm-eval over a JSONL file of ``rows``, as YAML in ``folder``; its path."""
    data = folder / f"{name}.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = [f"task: {name}", "dataset_path: json", "dataset_kwargs:",
             f"  data_files: {{test: {json.dumps(str(data))}}}",
             f"  cache_dir: {json.dumps(str(folder / 'datasets'))}", "test_split: test",
             *(f"{key}: {json.dumps(value)}" for key, value in config.items())]
    path = folder / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def mc_task(folder) -> str:
    return write_task(folder, "pax_mc", QUESTIONS, output_type="multiple_choice",
                      doc_to_text="{{question}}", doc_to_choice="choices",
                      doc_to_target="answer", metric_list=[{"metric": "acc"}])


def rolling_task(folder) -> str:
    return write_task(folder, "pax_rolling", DOCUMENTS, output_type="loglikelihood_rolling",
                      doc_to_text="", doc_to_target="{{text}}",
                      metric_list=[{"metric": "word_perplexity"}, {"metric": "bits_per_byte"}])


def evaluated(model, folder, task: str, **options) -> dict:
    """lm-eval's output for ``task`` (a YAML in ``folder``), its samples kept."""
    manager = TaskManager(include_path=str(folder), include_defaults=False)
    return simple_evaluate(model=model, tasks=[task], task_manager=manager, log_samples=True,
                           bootstrap_iters=0, **options)


def scored_alone(model, context: str, continuation: str):
    """Pax's score of one pair, as `pax score` gives it: a Scorer of one row."""
    pair = encode_pair(model.tokenizer, context, continuation)
    return single_row_scorer(model).score([pair])[0]


@functools.cache
def single_row_scorer(model) -> Scorer:
    """One Scorer of one row for the model: its program compiles once for each bucket length,
    not once for each pair (a Scorer compiles its own)."""
    return Scorer(model.decoder, model.variables, batch_size=1)


def test_multiple_choice_is_scored_as_pax_score_scores(model, tmp_path):
    mc_task(tmp_path)
    out = evaluated(model, tmp_path, "pax_mc")
    samples = sorted(out["samples"]["pax_mc"], key=lambda s: s["doc_id"])
    assert len(samples) == len(QUESTIONS)
    correct = []
    for sample, question in zip(samples, QUESTIONS, strict=True):
        pairs = [tuple(a) for a in sample["arguments"]]
        assert pairs == [(question["question"], f" {c}") for c in question["choices"]]
        expected = [scored_alone(model, *pair) for pair in pairs]
        got = sample["filtered_resps"]
        np.testing.assert_allclose([g[0] for g in got], [e.log_likelihood for e in expected],
                                   rtol=1e-5)
        assert [bool(g[1]) for g in got] == [e.is_greedy for e in expected]
        correct.append(int(np.argmax([e.log_likelihood for e in expected])) == 0)
    assert out["results"]["pax_mc"]["acc,none"] == pytest.approx(np.mean(correct))


def reference_rolling(model, text: str) -> float:
    """A document's log-likelihood after bos by full passes of the decoder: the first predicts
    its first 32 tokens (the model's length); each later block of up to 32 by one pass over the
    32 tokens before the block's last token. Every token is predicted once, with as much of
    the text before it as the model reads."""
    row, length = [model.tokenizer.bos_id, *model.tokenizer.encode(text)], model.max_length
    total, end = 0.0, 0  # row[1:end + 1] are predicted
    while end < len(row) - 1:
        last = min(len(row) - 1, end + length)
        total += float(np.sum(log_probs(model, row[max(0, last - length):last + 1])
                              [-(last - end):]))
        end = last
    return total


def log_probs(model, row: list[int]) -> np.ndarray:
    """The log-probability of each of ``row[1:]`` after the tokens before it: one pass."""
    logits = model.decoder.apply(model.variables, jnp.asarray([row[:-1]], jnp.int32))[0]
    table = np.asarray(jax.nn.log_softmax(logits.astype(jnp.float32)))
    return table[np.arange(len(row) - 1), row[1:]]


def word_perplexity(log_likelihoods: list[float]) -> float:
    words = sum(len(re.split(r"\s+", d["text"])) for d in DOCUMENTS)
    return math.exp(-sum(log_likelihoods) / words)


def test_rolling_log_likelihood_is_the_sum_of_full_pass_log_probabilities(model, tmp_path):
    rolling_task(tmp_path)
    out = evaluated(model, tmp_path, "pax_rolling")
    samples = sorted(out["samples"]["pax_rolling"], key=lambda s: s["doc_id"])
    assert len(model.tokenizer.encode(DOCUMENTS[1]["text"])) > 3 * model.max_length
    got = [float(s["filtered_resps"][0]) for s in samples]
    expected = [reference_rolling(model, d["text"]) for d in DOCUMENTS]
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    assert out["results"]["pax_rolling"]["word_perplexity,none"] == pytest.approx(
        word_perplexity(expected), rel=1e-4)


def greedy(model, engine, prompt: str, stop: tuple[str, ...] = ()) -> str:
    """The engine's greedy continuation of ``prompt`` alone (one slot), at most 8 tokens, cut
    before the first of ``stop``; the prompt keeps the tokens that leave room for 8 more."""
    settings = SamplingSettings(max_tokens=8, stop=stop, stop_ids=(model.tokenizer.eos_id,))
    ids = [model.tokenizer.bos_id, *model.tokenizer.encode(prompt)][-(model.max_length - 8):]
    [done] = Batcher(engine, model.tokenizer.decode).run([Request(ids, settings)])
    return done.text


def test_generation_is_the_engines_greedy_continuation_cut_at_until(model, tmp_path):
    assert len(model.tokenizer.encode(PROMPTS[-1]["prompt"])) + 1 > model.max_length - 8
    engine = Engine(model.decoder, model.variables, slots=1)
    uncut = [greedy(model, engine, p["prompt"]) for p in PROMPTS]
    until = uncut[0][2]  # a character greedy decoding writes: the first prompt stops before it
    write_task(tmp_path, "pax_gen", PROMPTS, output_type="generate_until",
               doc_to_text="{{prompt}}", doc_to_target="{{target}}",
               generation_kwargs={"until": [until], "max_gen_toks": 8, "do_sample": False},
               metric_list=[{"metric": "exact_match"}])
    out = evaluated(model, tmp_path, "pax_gen")
    got = [s["filtered_resps"][0] for s in sorted(out["samples"]["pax_gen"],
                                                  key=lambda s: s["doc_id"])]
    expected = [greedy(model, engine, p["prompt"], (until,)) for p in PROMPTS]
    assert got == expected
    assert expected[0] == uncut[0][:uncut[0].index(until)]


def test_generation_settings_are_pax_decodings():
    assert sampling_settings({"until": "\n\n", "max_gen_toks": 5, "do_sample": False,
                              "temperature": 0.7}, 3, "t", 2) == SamplingSettings(
        max_tokens=5, seed=3, stop=("\n\n",), stop_ids=(2,))
    assert sampling_settings({"do_sample": True}, 0, "t", 2) == SamplingSettings(
        max_tokens=256, temperature=1.0, stop_ids=(2,))
    assert sampling_settings({"until": [], "temperature": 0.5, "top_k": 4, "top_p": 0.9}, 1, "t",
                             2) == SamplingSettings(max_tokens=256, temperature=0.5, top_k=4,
                                                    top_p=0.9, seed=1, stop_ids=(2,))
    with pytest.raises(UsageError, match=r"^task t asks for generation settings num_beams, "
                                         r"which Pax's decoding does not have"):
        sampling_settings({"until": ["x"], "num_beams": 4}, 0, "t", 2)
    with pytest.raises(UsageError, match=r"^task t: max_tokens must be >= 1, got 0$"):
        sampling_settings({"max_gen_toks": 0}, 0, "t", 2)


def test_pax_eval_harness_writes_the_results_and_refuses_an_unknown_task(
        job, model, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    output = tmp_path / "results.json"
    result = run_pax("eval", "--harness", f"{mc_task(tmp_path)},{rolling_task(tmp_path)}",
                     "--harness-limit", "3", "--job-dir", str(job), "--output", str(output),
                     timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(output.read_text())
    assert (report["harness"], report["step"]) == ("lm/lm-eval", 40)
    correct = [max(range(len(q["choices"])), key=lambda c: scored_alone(
        model, q["question"], f" {q['choices'][c]}").log_likelihood) == q["answer"]
               for q in QUESTIONS[:3]]
    assert report["results"]["pax_mc"]["acc"] == pytest.approx(np.mean(correct))
    assert set(report["results"]["pax_mc"]) == {"acc", "acc_stderr"}
    rolled = [reference_rolling(model, d["text"]) for d in DOCUMENTS]
    assert report["results"]["pax_rolling"]["word_perplexity"] == pytest.approx(
        word_perplexity(rolled), rel=1e-4)
    assert report["lm_eval"]["n-samples"]["pax_mc"] == {"original": 5, "effective": 3}
    lines = result.stdout.splitlines()  # lm-eval's own prints go to stderr
    assert [line.split()[:3] for line in lines[:2]] == [["step", "40", "lm-eval/pax_mc"],
                                                        ["step", "40", "lm-eval/pax_rolling"]]
    printed = dict(item.split("=") for item in lines[0].split()[3:])
    assert printed.keys() == report["results"]["pax_mc"].keys()
    for name, value in printed.items():
        assert float(value) == pytest.approx(report["results"]["pax_mc"][name], rel=1e-3)
    assert lines[2:] == [f"wrote the results to {output}"]

    unknown = run_pax("eval", "--harness", "hellaswg", "--job-dir", str(job), "--output",
                      str(tmp_path / "none.json"))
    assert unknown.returncode == 2, unknown.stderr
    assert re.fullmatch(r"pax: error: --harness: lm-eval has no task 'hellaswg'; did you mean "
                        r"hellaswag(, [\w]+)*\? \(lm-eval ls tasks lists them; a task's YAML "
                        r"file may be named by its path\)\n", unknown.stderr), unknown.stderr
    assert not (tmp_path / "none.json").exists()


def test_a_task_whose_data_cannot_be_read_stops_before_the_job_is_restored(tmp_path):
    task = mc_task(tmp_path)
    (tmp_path / "pax_mc.jsonl").unlink()
    nowhere = JobRequest(isolated_host(), str(tmp_path / "job"), None, None, [], None, None)
    with pytest.raises(RunError, match=rf"^--harness: lm-eval cannot read the data of "
                                       rf"{re.escape(task)}: .*pax_mc\.jsonl.* \(nothing was "
                                       rf"evaluated\)$"):
        evaluate(nowhere, [task])
