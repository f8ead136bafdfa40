"""The decoding engine: rows of different requests share a batch without changing what any row
decodes; its programs compile once; ``pax decode --prompts`` streams a file through it."""

from __future__ import annotations

import importlib
import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pax_core import UsageError
from pax_core.testing import isolated_host, run_pax, train
from pax_lm import Batcher, Engine, Request, SamplingSettings
from pax_lm.commands.decode import read_prompts
from pax_lm.commands.lm_jobs import written_whole
from pax_lm.decoding import sample
from pax_transformer import TransformerLm

TINY = dict(vocab_size=48, num_layers=2, model_dims=32, hidden_dims=64, num_heads=4,
            max_seq_len=32, tied_embedding=False)
CONFIGS = {"rotary-gqa": {"num_kv_heads": 2},
           "scan-window-global": {"scan_layers": True, "sliding_window": 5, "global_every": 2}}
LOWERING_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"


def _model(**overrides) -> tuple[TransformerLm, dict]:
    """A tiny random decoder whose greedy continuations vary (weights N(0, 0.3), norm scales
    around 1), and its variables."""
    model = TransformerLm(**{**TINY, **overrides})
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.PRNGKey(0),
                                     jnp.zeros((1, 4), jnp.int32)))
    rng = np.random.default_rng(0)

    def draw(path, shape):
        value = rng.normal(0.0, 0.3, shape.shape) + (path[-1].key == "scale")
        return jnp.asarray(value, shape.dtype)

    return model, {"params": jax.tree_util.tree_map_with_path(draw, shapes["params"])}


def _prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, TINY["vocab_size"], length).tolist()


def _greedy_by_full_passes(model, variables, prompt: list[int], count: int) -> list[int]:
    """The reference: each next token the argmax of a full pass (no cache) over the sequence so
    far, zero-padded to the model's length (causal: the padding changes nothing before it)."""
    forward = jax.jit(lambda ids: model.apply(variables, ids))
    tokens = list(prompt)
    while len(tokens) < len(prompt) + count:
        ids = np.zeros((1, model.max_seq_len), np.int32)
        ids[0, :len(tokens)] = tokens
        tokens.append(int(np.argmax(forward(ids)[0, len(tokens) - 1])))
    return tokens[len(prompt):]


def _letters(ids) -> str:
    """A detokenizer for the tiny models: one letter a token."""
    return "".join(chr(ord("a") + i % 26) for i in ids)


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_batched_greedy_decoding_equals_each_prompt_decoded_alone(overrides):
    model, variables = _model(**overrides)
    # Three prompts join at first, prefilled together; the third ends at its first token, so
    # its row is left out when the others are inserted.
    lengths, news = [1, 9, 3, 17, 6, 12, 2], [8, 5, 1, 9, 3, 14, 7]
    prompts = [_prompt(n, seed) for seed, n in enumerate(lengths)]
    engine = Engine(model, variables, slots=3)  # fewer slots than prompts: slots are reused
    got = list(Batcher(engine).run(
        Request(p, SamplingSettings(max_tokens=k)) for p, k in zip(prompts, news, strict=True)))
    for prompt, new, done in zip(prompts, news, got, strict=True):
        assert done.tokens == _greedy_by_full_passes(model, variables, prompt, new)
        assert done.finish_reason == "length"
    assert len({tuple(d.tokens) for d in got}) > 3  # the model does not say one thing
    assert engine.free_slots == 3


def test_seeded_sampling_draws_the_same_alone_and_in_a_batch():
    model, variables = _model()
    engine = Engine(model, variables, slots=4)
    batcher = Batcher(engine)
    settings = SamplingSettings(max_tokens=12, temperature=1.5, top_k=20, top_p=0.95, seed=5)
    mine = Request(_prompt(6, 0), settings)
    [alone] = batcher.run([mine])
    others = [Request(_prompt(4 + i, 10 + i), SamplingSettings(
        max_tokens=9 + i, temperature=1.0 + i / 4, top_k=5 * i, seed=100 + i)) for i in range(3)]
    # Beside three others, in another slot, joining a batch already running.
    together = list(batcher.run([others[0], others[1], mine, others[2]]))
    assert together[2].tokens == alone.tokens
    [reseeded] = batcher.run([Request(mine.prompt, SamplingSettings(
        max_tokens=12, temperature=1.5, top_k=20, top_p=0.95, seed=6))])
    assert reseeded.tokens != alone.tokens  # the seed does draw: the tokens are not greedy's
    [greedy] = batcher.run([Request(mine.prompt, SamplingSettings(max_tokens=12))])
    assert greedy.tokens != alone.tokens


def test_each_row_samples_within_its_own_top_k_and_top_p():
    probs = np.asarray([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])
    logits = jnp.log(jnp.tile(probs, (4, 1)))
    top_k = jnp.asarray([1, 3, 0, 0], jnp.int32)
    top_p = jnp.asarray([1.0, 1.0, 0.6, 1.0], jnp.float32)
    temperature = jnp.asarray([1.0, 1.0, 1.0, 0.0], jnp.float32)
    draw = jax.jit(lambda position: sample(logits, jnp.arange(4, dtype=jnp.uint32),
                                           jnp.full((4,), position), temperature, top_k, top_p))
    drawn = np.stack([draw(p) for p in range(200)])
    assert set(drawn[:, 0]) == {0}  # top-1
    assert set(drawn[:, 1]) == {0, 1, 2}  # top-3
    assert set(drawn[:, 2]) == {0, 1}  # 0.4 + 0.25 holds 0.6
    assert set(drawn[:, 3]) == {0}  # temperature 0: greedy


def test_stop_strings_stop_ids_max_tokens_and_the_models_length():
    model, variables = _model()
    batcher = Batcher(Engine(model, variables, slots=2), _letters)
    prompt = _prompt(5, 6)
    [free] = batcher.run([Request(prompt, SamplingSettings(max_tokens=16))])
    text = _letters(free.tokens)
    assert free.text == text and free.finish_reason == "length" and len(free.tokens) == 16
    # Two stop strings spelled by several tokens, both complete at one token: the text is cut
    # before the one that starts first.
    stops = (text[6:8], text[5:8])
    cut = min(text.find(s) for s in stops)
    end = min(text.find(s) + len(s) for s in stops)
    stop_id = free.tokens[4]
    first_stop_id = free.tokens.index(stop_id)
    runs = batcher.run([
        Request(prompt, SamplingSettings(max_tokens=16, stop=("zzzz", *stops))),
        Request(prompt, SamplingSettings(max_tokens=16, stop_ids=(stop_id,))),
        Request(prompt, SamplingSettings(max_tokens=4)),
        Request(_prompt(29, 4), SamplingSettings(max_tokens=100)),
    ])
    by_string, by_id, short, long = runs
    assert (by_string.text, by_string.finish_reason) == (text[:cut], "stop")
    assert cut < text.find(stops[0]) and by_string.tokens == free.tokens[:end]
    assert (by_id.tokens, by_id.finish_reason) == (free.tokens[:first_stop_id], "stop")
    assert (short.tokens, short.finish_reason) == (free.tokens[:4], "length")
    assert (len(long.tokens), long.finish_reason) == (32 - 29, "length")


def test_programs_compile_once_per_engine():
    model, variables = _model()
    engine = Engine(model, variables, slots=2)
    batcher = Batcher(engine)

    def requests(seed: int) -> list[Request]:
        lengths = [3, 20, 7, 16, 25, 1]  # buckets 16 and 32
        return [Request(_prompt(n, seed + i), SamplingSettings(
            max_tokens=2 + (seed + i) % 6, temperature=(i % 3) / 2, top_k=i, seed=seed + i))
            for i, n in enumerate(lengths)]

    assert len(list(batcher.run(requests(0)))) == 6
    compiled = engine.compilations()  # which row counts join together depends on the stops
    assert engine.row_counts == (1, 2) and compiled["generate"] == 1
    assert 2 <= compiled["prefill"] <= 2 * 2 and 1 <= compiled["insert"] <= 2
    lowered = []
    listener = lambda event, *_, **__: lowered.append(event)  # noqa: E731
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        assert len(list(batcher.run(requests(50)))) == 6
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert engine.compilations() == compiled
    assert LOWERING_EVENT not in lowered  # nothing else compiled either


def test_what_the_engine_refuses():
    model, variables = _model()
    batcher = Batcher(Engine(model, variables, slots=1))
    with pytest.raises(UsageError, match="the prompt is 32 tokens long; this model's maximum "
                                         "length is 32, so the prompt must be at most 31"):
        batcher.submit(Request(_prompt(32, 0)))
    with pytest.raises(UsageError, match="the prompt is empty"):
        batcher.submit(Request([]))
    with pytest.raises(ValueError, match="detokenize"):
        batcher.submit(Request([3], SamplingSettings(stop=("x",))))
    assert not batcher.busy  # nothing refused was queued
    for field, value, message in [("max_tokens", -1, "max_tokens must be >= 1"),
                                  ("top_p", 0.0, r"top_p must be in \(0, 1\]"),
                                  ("seed", 2**32, r"seed must be in \[0, 2\*\*32\)"),
                                  ("top_k", True, "top_k must be a whole number"),
                                  ("stop", ("",), "stop must be a list of non-empty strings")]:
        with pytest.raises(UsageError, match=message):
            SamplingSettings(**{field: value})


def test_a_prompts_file_is_checked_line_by_line(tmp_path):
    defaults = SamplingSettings(max_tokens=7, temperature=0.5)
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "a"}\n\n{"prompt": "b", "max_tokens": 3, "stop": ["x"], '
                    '"seed": 4}\n')
    assert read_prompts(good, defaults) == [
        (1, "a", defaults),
        (3, "b", SamplingSettings(max_tokens=3, temperature=0.5, seed=4, stop=("x",)))]
    for line, message in [('{"prompt": "a"', "invalid JSON"),
                          ('["a"]', "expected a JSON object"),
                          ('{"prompt": "a", "n": 2}', "unknown key 'n'"),
                          ('{"prompt": "a", "max_tokens": -2}', "max_tokens must be >= 1"),
                          ('{"prompt": "a", "stop": "x"}', "'stop' must be a list of strings"),
                          ('{"max_tokens": 2}', "'prompt' must be text, got nothing")]:
        bad = tmp_path / "bad.jsonl"
        bad.write_text(f'{{"prompt": "fine"}}\n{line}\n')
        with pytest.raises(UsageError, match=f"^{bad}:2: .*{message}"):
            read_prompts(bad, defaults)


def test_the_output_appears_whole_or_not_at_all(tmp_path):
    output = tmp_path / "out.jsonl"
    with pytest.raises(KeyboardInterrupt), written_whole(output, primary=True) as f:
        f.write("half\n")
        assert (tmp_path / "out.jsonl.partial").exists() and not output.exists()
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []
    with written_whole(output, primary=True) as f:
        f.write("whole\n")
    assert list(tmp_path.iterdir()) == [output] and output.read_text() == "whole\n"
    with written_whole(tmp_path / "other.jsonl", primary=False) as f:
        assert f is None  # another process of the job: it decodes, process 0 writes
    assert list(tmp_path.iterdir()) == [output]


@pytest.fixture(scope="module")
def tiny_job(tmp_path_factory):
    host = isolated_host(("lm", importlib.import_module("pax_lm.plugin")),
                         ("transformer", importlib.import_module("pax_transformer.plugin")))
    job_dir = tmp_path_factory.mktemp("decode_job")
    train(host, exp="TinyLmForTests", plugin="lm", job_dir=str(job_dir), set_items=[
        "NUM_TRAIN_STEPS=4", "CHECKPOINT_EVERY_N_STEPS=4", "EVAL_INTERVAL_STEPS=1000"])
    return job_dir


def test_pax_decode_prompts_streams_a_file_through_the_slots(tiny_job, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"prompt": "And God said"},
             {"prompt": "In the beginning God created", "max_tokens": 3},
             {"prompt": "And", "temperature": 0.8, "top_k": 20, "seed": 3, "stop": ["e"]},
             {"prompt": "The LORD"}]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    output = tmp_path / "out.jsonl"
    args = ["decode", "--job-dir", str(tiny_job), "--prompts", str(prompts), "--output",
            str(output), "--batch-size", "2", "--max-tokens", "12"]
    result = run_pax(*args)
    assert result.returncode == 0, result.stderr
    assert f"4 completions -> {output}" in result.stdout
    got = [json.loads(line) for line in output.read_text().splitlines()]
    assert [g["prompt"] for g in got] == [line["prompt"] for line in lines]
    assert all(set(g) == {"prompt", "completion", "tokens", "finish_reason"} for g in got)
    assert (got[1]["tokens"], got[1]["finish_reason"]) == (3, "length")
    assert got[0]["tokens"] <= 12 and "e" not in got[2]["completion"]
    assert not (tmp_path / "out.jsonl.partial").exists()

    # The batch changes nothing: --prompt alone continues the first prompt the same way.
    alone = run_pax("decode", "--job-dir", str(tiny_job), "--prompt", "And God said",
                    "--max-tokens", "12")
    assert alone.stdout.strip().splitlines()[-1].endswith(f"And God said{got[0]['completion']}")

    written = output.read_text()
    again = run_pax(*args)
    assert again.returncode == 2
    assert again.stderr.strip() == (f"pax: error: --output {output} exists; pass --overwrite to "
                                    f"replace it, or name another file")
    assert output.read_text() == written
    assert run_pax(*args, "--overwrite").returncode == 0


@pytest.mark.parametrize(("line", "message"), [
    ('{"prompt": "x", "temprature": 1}', "unknown key 'temprature'"),
    ('{"prompt": "' + "x" * 40 + '"}', "the prompt is 41 tokens long; this model's maximum "
                                        "length is 32"),
], ids=["unknown-key", "too-long"])
def test_pax_decode_refuses_a_bad_line_and_writes_nothing(tiny_job, tmp_path, line, message):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(f'{{"prompt": "fine"}}\n{line}\n')
    output = tmp_path / "out.jsonl"
    result = run_pax("decode", "--job-dir", str(tiny_job), "--prompts", str(prompts),
                     "--output", str(output))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and f"{prompts}:2: " in result.stderr
    assert message in result.stderr
    assert list(tmp_path.iterdir()) == [prompts]


def test_several_steps_a_call_give_the_tokens_of_one_step_a_call():
    """A call of several steps reads its tokens once; a request that ends inside a call (a
    stop id, a stop string, max_tokens) ends at the same token as with one step a call."""
    model, variables = _model()
    requests = [Request(_prompt(3 + 5 * i, 70 + i), SamplingSettings(
        max_tokens=5 + 3 * i, temperature=0.5 * (i % 3), top_k=4 * i, seed=i,
        stop_ids=(7,) if i % 2 else (), stop=("ab",) if i == 3 else ())) for i in range(6)]
    found = {k: list(Batcher(Engine(model, variables, slots=2, steps_per_call=k), _letters)
                     .run(requests)) for k in (1, 3, 8)}
    assert found[3] == found[1] == found[8]
    assert {c.finish_reason for c in found[1]} == {"stop", "length"}
