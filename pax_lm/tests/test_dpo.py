"""Preference tuning (DPO): JSONL preference pairs become pairs of rows weighted on their answers
only; the loss and its metrics follow DPO's formulas against the reference, a frozen copy of
the weights that train as they start (the adapters: the base model, or a LoRA job's model it
continues; every weight without adapters: an imported model), which training never moves; a
tiny model learns a held-out preference; bad pairs are one UsageError naming file and line,
and `pax train` refuses them."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import pytest

from pax_core import UsageError, key_paths
from pax_core.testing import (
    build_run,
    import_job,
    isolated_host,
    read_params,
    resolve,
    run_pax,
    train,
)
from pax_lm.dpo.model import DpoLanguageModel
from pax_lm.dpo.pairs import read_pairs
from pax_lm.dpo.preference_input import PreferenceInput
from pax_lm.models import LanguageModel
from pax_lm.tokenizers import ByteTokenizer
from pax_transformer import ADAPTER_WEIGHTS, TransformerLm

BYTES = ByteTokenizer()


def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return str(path)


def make(path: str, **fields) -> PreferenceInput:
    settings = dict(tokenizer=BYTES, seq_len=64, batch_size=2, eval_fraction=0.0, shuffle=False,
                    repeat=False)
    return PreferenceInput(path=path, **{**settings, **fields})


def plain(turns: list[tuple[str, str]], answer: str) -> tuple[list[int], list[int]]:
    """The plain template's tokens of ``turns`` answered by ``answer``, and their train flags
    (the answer and its eos only)."""
    ids = [BYTES.bos_id]
    for role, text in turns:
        if role == "assistant":
            ids += [*BYTES.encode(f"<|assistant|>\n{text}"), BYTES.eos_id]
        else:
            ids += BYTES.encode(f"<|{role}|>\n{text}\n")
    ids += BYTES.encode("<|assistant|>\n")
    flags = [0] * len(ids)
    answer_ids = [*BYTES.encode(answer), BYTES.eos_id]
    return ids + answer_ids, flags + [1] * len(answer_ids)


def test_pairs_are_a_chosen_and_a_rejected_row_weighted_on_the_last_answer_only(tmp_path):
    turns = [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "2+2?")]
    path = write_jsonl(tmp_path / "p.jsonl", [
        {"system": "S", "prompt": "Say yes", "chosen": "yes", "rejected": "no way"},
        {"messages": [{"role": r, "content": c} for r, c in turns], "chosen": "4",
         "rejected": "5"},
        {"prompt": "Say no", "chosen": "no", "rejected": "yes"}])
    data = make(path, batch_size=2, seq_len=96)
    first, last = data.get_next(), data.get_next()
    assert {k: (v.shape, v.dtype) for k, v in first.items()} == {
        k: ((2, 2, 96), np.float32 if k == "weights" else np.int32)
        for k in ("ids", "labels", "weights")}
    assert {k: (v.shape, v.dtype) for k, v in data.abstract_batch().items()} == {
        k: (v.shape, v.dtype) for k, v in first.items()}
    batch = {k: np.concatenate([first[k], last[k]]) for k in first}
    expected = [(plain([("system", "S"), ("user", "Say yes")], a)) for a in ("yes", "no way")]
    expected += [plain(turns, a) for a in ("4", "5")]
    expected += [plain([("user", "Say no")], a) for a in ("no", "yes")]
    for i, (ids, flags) in enumerate(expected):
        row = {k: v[i // 2, i % 2] for k, v in batch.items()}
        n = len(ids) - 1
        np.testing.assert_array_equal(row["ids"][:n], ids[:-1])
        np.testing.assert_array_equal(row["labels"][:n], ids[1:])
        np.testing.assert_array_equal(row["weights"], np.pad(flags[1:], (0, 96 - n)))
        assert (row["ids"][n:] == BYTES.pad_id).all()
    # a finite input's last batch is filled with a weightless pair
    assert not batch["weights"][3].any() and (batch["ids"][3] == BYTES.pad_id).all()
    assert data.num_rows == 3 and data.num_batches() == 2


def test_a_models_template_trains_the_last_answer_only(tmp_path):
    """With a Jinja template (ChatML, rendered progressively) the earlier answer of a
    multi-turn prompt is context: only the pair's answer, <|im_end|> and its newline train."""
    from test_sft_data import CHATML, CHATML_SPECIAL, write_tokenizer

    tok = write_tokenizer(tmp_path / "qwen", CHATML_SPECIAL,
                          {"chat_template": CHATML, "eos_token": "<|im_end|>"})
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
             {"role": "user", "content": "2+2?"}]
    path = write_jsonl(tmp_path / "p.jsonl", [{"messages": turns, "chosen": "4",
                                               "rejected": "five"}])
    batch = make(path, tokenizer=tok, batch_size=1, seq_len=128).get_next()
    prompt = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in turns)
    prompt = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n" + prompt
              + "<|im_start|>assistant\n")
    for side, answer in enumerate(("4", "five")):
        ids = tok.encode(prompt) + tok.encode(f"{answer}<|im_end|>\n")
        n = len(ids) - 1
        np.testing.assert_array_equal(batch["ids"][0, side, :n], ids[:-1])
        np.testing.assert_array_equal(batch["labels"][0, side, :n], ids[1:])
        trained = len(tok.encode(f"{answer}<|im_end|>\n"))
        positions = np.arange(128)
        np.testing.assert_array_equal(batch["weights"][0, side],
                                      (positions >= n - trained) & (positions < n))


def test_long_pairs_lose_the_start_of_their_prompt_alike_and_long_answers_are_refused(tmp_path):
    prompt = "a long prompt " * 4
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": prompt, "chosen": "yes please",
                                               "rejected": "no"}])
    chosen, flags = plain([("user", prompt)], "yes please")
    rejected, _ = plain([("user", prompt)], "no")
    seq_len = 40
    batch = make(path, seq_len=seq_len, batch_size=1).get_next()
    cut = len(chosen) - (seq_len + 1)  # what the longer row needs; both lose as much
    assert cut > 0
    np.testing.assert_array_equal(batch["ids"][0, 0], chosen[cut:-1])
    np.testing.assert_array_equal(batch["weights"][0, 0], flags[cut + 1:])
    n = len(rejected) - cut - 1
    np.testing.assert_array_equal(batch["ids"][0, 1, :n], rejected[cut:-1])
    np.testing.assert_array_equal(batch["labels"][0, 1, :n], rejected[cut + 1:])
    assert batch["weights"][0, 1].sum() == 3  # "no" and eos
    # 10 answer tokens (and eos) leave no room in rows of 10 for a token of prompt
    with pytest.raises(UsageError, match=rf"^{tmp_path / 'p.jsonl'}:1: the chosen answer takes "
                                         r"11 tokens, too many for rows of 10 beside its "
                                         r"prompt; raise seq_len \(MAX_SEQ_LEN\)"):
        make(path, seq_len=10, batch_size=1).check()


def test_held_out_pairs_are_chosen_by_prompt_and_disjoint(tmp_path):
    rows = [{"prompt": f"prompt {i % 20}", "chosen": f"good {i}", "rejected": f"bad {i}"}
            for i in range(60)]
    path = write_jsonl(tmp_path / "p.jsonl", rows)
    pairs = read_pairs(path)
    train = make(path, eval_fraction=0.2, batch_size=1)
    held = make(path, eval_fraction=0.2, split="eval", batch_size=1)
    prompts = {}
    for data in (train, held):
        seen = set()
        for _ in range(data.num_batches()):
            ids = data.get_next()["ids"][0, 0]
            seen.add(BYTES.decode([int(t) for t in ids if t < 256]).split("\n")[1])
        prompts[data.split] = seen
    assert len(prompts["eval"]) == 4 and len(prompts["train"]) == 16
    assert not prompts["eval"] & prompts["train"]
    assert train.num_rows + held.num_rows == len(pairs)


GOOD = json.dumps({"prompt": "a", "chosen": "B", "rejected": "C"})
BAD_LINES = [
    ('{"prompt": "a", "chosen": "B"}', "no 'rejected' answer; give both 'chosen' and 'rejected'"),
    ('{"prompt": "a", "rejected": "B"}', "no 'chosen' answer"),
    ('{"prompt": "a", "chosen": " ", "rejected": "B"}', "the 'chosen' answer is empty"),
    ('{"prompt": "a", "chosen": "B", "rejected": ""}', "the 'rejected' answer is empty"),
    ('{"prompt": "a", "chosen": "B", "rejected": "B"}',
     "'chosen' and 'rejected' are the same answer, so there is nothing to prefer"),
    ('{"prompt": "a", "chosen": ["B"], "rejected": "C"}', "'chosen' is a JSON array, not a str"),
    ('{"chosen": "B", "rejected": "C"}', r"no prompt \(fields: chosen, rejected\)"),
    ('{"prompt": 1, "chosen": "B", "rejected": "C"}', "'prompt' is a JSON number"),
    ('{"messages": [{"role": "bot", "content": "a"}], "chosen": "B", "rejected": "C"}',
     "message 1 has role 'bot'; use one of system, user, assistant"),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], '
     '"chosen": "B", "rejected": "C"}', "the prompt ends with an assistant turn"),
    ('{"messages": [], "chosen": "B", "rejected": "C"}', "has no messages"),
    ('{"messages": [{"role": "user", "content": "a"}], "system": "s", "chosen": "B", '
     '"rejected": "C"}', "both 'messages' and 'prompt'/'system'"),
    ("[1]", "a JSON array, not an object; write each preference pair as"),
    ("{oops", r"invalid JSON \(Expecting property name"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_bad_lines_are_one_usage_error_naming_file_and_line(tmp_path, line, message):
    path = write_jsonl(tmp_path / "p.jsonl", [GOOD, "", line, GOOD])
    with pytest.raises(UsageError, match=message) as error:
        read_pairs(tmp_path)
    assert str(error.value).startswith(f"{path}:3: ") and "\n" not in str(error.value)


def tiny_decoder(lora_rank: int = 2) -> TransformerLm:
    return TransformerLm(vocab_size=40, num_layers=1, model_dims=16, hidden_dims=32, num_heads=2,
                         dim_per_head=8, max_seq_len=16, lora_rank=lora_rank,
                         lora_targets=("query", "value", "down"), dtype="float32")


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = logits.astype(np.float64)
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def _base_params(params: dict) -> dict:
    """The decoder's parameters without its adapters, for a decoder without them."""
    if isinstance(params, dict):
        return {k: _base_params(v) for k, v in params.items() if not k.startswith("lora_")}
    return params


def _answer_log_probs(decoder, decoder_params, batch) -> np.ndarray:
    """Per pair and row, the log-probability of the weighted labels, in float64 on the host."""
    pairs, rows, length = batch["ids"].shape
    flat = {k: v.reshape(pairs * rows, length) for k, v in batch.items()}
    logits = np.asarray(jax.jit(decoder.apply)({"params": decoder_params}, flat["ids"]))
    picked = np.take_along_axis(_log_softmax(logits), flat["labels"][..., None], -1)[..., 0]
    return (picked * flat["weights"]).sum(-1).reshape(pairs, rows)


def _moved(params: dict, rng, names: tuple[str, ...] = ()) -> dict:
    """``params`` with noise added to the leaves named ``names`` (all leaves when empty)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: x + rng.normal(0, 0.5, x.shape).astype(np.float32)
        if not names or path[-1].key in names else x, params)


def _batch(rng) -> dict:
    batch = {"ids": rng.integers(0, 40, (4, 2, 12)).astype(np.int32),
             "labels": rng.integers(0, 40, (4, 2, 12)).astype(np.int32),
             "weights": (rng.random((4, 2, 12)) < 0.5).astype(np.float32)}
    batch["weights"][3] = 0  # a padding pair
    return batch


def test_loss_and_metrics_follow_the_formulas_against_the_starting_adapters():
    beta = 0.5
    model = DpoLanguageModel(tiny_decoder(), beta=beta, copied=ADAPTER_WEIGHTS)
    rng = np.random.default_rng(0)
    batch = _batch(rng)
    params = nn.meta.unbox(jax.device_get(jax.jit(model.init)(jax.random.key(0), batch)))[
        "params"]
    # the reference holds a copy of the adapters alone, as they start
    adapters = {k: v for k, v in key_paths(params["decoder"]).items() if k[-1].startswith("lora")}
    copied = key_paths(params["reference"])
    assert adapters and copied.keys() == adapters.keys()
    for name, value in adapters.items():
        np.testing.assert_array_equal(copied[name], value, err_msg=str(name))
    apply = jax.jit(model.apply, static_argnames="method")
    fresh = apply({"params": params}, batch)
    # fresh adapters: the policy is the reference, bitwise
    assert fresh.loss == np.float32(np.log(2)), fresh.loss
    for name in ("reward_margin", "chosen_reward", "rejected_reward", "preference_accuracy"):
        assert not np.asarray(fresh.metrics[name][0]).any(), name

    trained = {**params, "decoder": _moved(params["decoder"], rng, ("lora_b",))}
    out = apply({"params": trained}, batch)
    policy = _answer_log_probs(tiny_decoder(), trained["decoder"], batch)
    # the copy's lora_b is zero: the reference is the base without adapters
    reference = _answer_log_probs(tiny_decoder(lora_rank=0), _base_params(trained["decoder"]),
                                  batch)
    rewards = beta * (policy - reference)
    margin = rewards[:, 0] - rewards[:, 1]
    losses = np.log1p(np.exp(-margin))
    weight = np.array([1, 1, 1, 0])
    assert abs(margin[:3]).min() > 1e-3  # the adapters moved every pair
    np.testing.assert_allclose(out.loss, (losses * weight).sum() / 3, rtol=1e-5)
    expected = {"loss": losses, "reward_margin": margin, "chosen_reward": rewards[:, 0],
                "rejected_reward": rewards[:, 1],
                "preference_accuracy": (rewards[:, 0] > rewards[:, 1]).astype(np.float32)}
    for name, values in expected.items():
        got, weights = out.metrics[name]
        np.testing.assert_allclose(got, values, rtol=1e-4, atol=1e-6, err_msg=name)
        np.testing.assert_array_equal(weights, weight, err_msg=name)
    assert out.metrics["num_pairs"] == (3, None)
    assert out.num_tokens == batch["weights"].sum()
    got_policy, got_reference = apply({"params": trained}, batch, method="log_probs")
    np.testing.assert_allclose(got_reference, reference, rtol=1e-5)
    np.testing.assert_allclose(got_policy, policy, rtol=1e-5)

    # adapters that started trained (a supervised job's): the reference is that model
    started = {**trained, "reference": _moved(params["reference"], rng)}
    _, got_reference = apply({"params": started}, batch, method="log_probs")
    start_decoder = jax.tree.map(lambda x: x, trained["decoder"])  # new dicts, same leaves
    for path, value in key_paths(started["reference"]).items():
        node = start_decoder
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    np.testing.assert_allclose(got_reference, _answer_log_probs(tiny_decoder(), start_decoder,
                                                                batch), rtol=1e-5)
    assert np.abs(np.asarray(got_reference) - reference).max() > 1e-2

    # the reference takes no gradient: not even the base weights' (the learner freezes them)
    grads = jax.jit(jax.grad(lambda p: model.apply({"params": p}, batch,
                                                   method="log_probs")[1].sum()))(started)
    assert not any(np.asarray(g).any() for g in jax.tree.leaves(grads))

    spec = {"ids": jax.ShapeDtypeStruct((4, 2, 12), np.int32)}
    lm = LanguageModel(tiny_decoder()).flops_per_step(
        {"ids": jax.ShapeDtypeStruct((8, 12), np.int32)})
    assert model.flops_per_step(spec) == pytest.approx(lm * 4 / 3)


def test_without_adapters_the_reference_is_a_frozen_copy_of_the_first_weights():
    model = DpoLanguageModel(tiny_decoder(lora_rank=0), beta=0.1)
    rng = np.random.default_rng(1)
    batch = _batch(rng)
    params = nn.meta.unbox(jax.device_get(jax.jit(model.init)(jax.random.key(0), batch)))[
        "params"]
    jax.tree.map(np.testing.assert_array_equal, params["reference"], params["decoder"])
    trained = {**params, "decoder": _moved(params["decoder"], rng)}
    policy, reference = jax.jit(model.apply, static_argnames="method")(
        {"params": trained}, batch, method="log_probs")
    decoder = tiny_decoder(lora_rank=0)
    np.testing.assert_allclose(reference, _answer_log_probs(decoder, params["decoder"], batch),
                               rtol=1e-5)
    np.testing.assert_allclose(policy, _answer_log_probs(decoder, trained["decoder"], batch),
                               rtol=1e-5)
    assert np.abs(np.asarray(policy) - np.asarray(reference)).max() > 1e-2
    with pytest.raises(UsageError, match=r"^the DPO reference copies the decoder weights "
                                         r"matching 'lora_x', and none does"):
        DpoLanguageModel(tiny_decoder(lora_rank=0), copied="lora_x").init(jax.random.key(0),
                                                                          batch)


@pytest.fixture(scope="module")
def host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")))


def say_yes_or_no(count: int, seed: int = 0) -> list[dict]:
    """Prompts ``"<word> say yes"`` or ``"... say no"``, the chosen answer obeying."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(count):
        word = "".join(rng.choice(list("abcdefghij"), 4))
        asked, other = ("yes", "no") if i % 2 else ("no", "yes")
        rows.append({"prompt": f"{word} say {asked}", "chosen": asked, "rejected": other})
    return rows


def test_experiments_take_dpo_data(host, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", say_yes_or_no(20))
    config = resolve(host, "TinyLmForTests", "lm", [f"DPO_DATA='{path}'", "LORA_RANK=2",
                                                    "DPO_BETA=0.3"]).config
    assert (config.task.model.__fn_or_cls__, config.task.model.beta) == (DpoLanguageModel, 0.3)
    assert config.task.model.decoder.lora_rank == 2
    assert [(d.__fn_or_cls__, d.split, d.path, d.eval_fraction) for d in config.datasets] == [
        (PreferenceInput, "train", path, 0.02), (PreferenceInput, "eval", path, 0.02)]
    config = resolve(host, "TinyLmForTests", "lm", [f"DPO_DATA='{path}'",
                                                    "DPO_EVAL_FRACTION=0"]).config
    assert [d.name for d in config.datasets] == ["train"]
    assert resolve(host, "TinyLmForTests", "lm", []).config.task.model.__fn_or_cls__ is (
        LanguageModel)
    for other in ("SFT_DATA='c.jsonl'", "CORPUS_PATH='x.txt'", "TRAIN_DATA='prepared'"):
        with pytest.raises(UsageError, match=r"^give DPO_DATA \(preference pairs\) alone, "
                                             r"without SFT_DATA, CORPUS_PATH or TRAIN_DATA$"):
            resolve(host, "TinyLmForTests", "lm", [f"DPO_DATA='{path}'", other])


def test_dpo_learns_a_held_out_preference_and_the_reference_stays_the_base(host, tmp_path):
    """A tiny LM's adapters learn to answer as the prompt says (yes or no) from 30 steps of DPO,
    on prompts held out from training; the reference is still the untrained base."""
    path = write_jsonl(tmp_path / "p.jsonl", say_yes_or_no(240))
    sets = [f"DPO_DATA='{path}'", "LORA_RANK=4", "MAX_SEQ_LEN=40", "LEARNING_RATE=1e-2",
            "LR_SCHEDULE='constant'", "DPO_EVAL_FRACTION=0.2", "DPO_BETA=0.5"]
    run = build_run(host, resolve(host, "TinyLmForTests", None, sets), jax.devices())
    step = run.compile_train_step(donate_state=False)
    model, heldout = run.task.model, run.eval_inputs[0]
    metrics_of = jax.jit(lambda params, batch: model.apply({"params": params}, batch).metrics)

    def accuracy(params) -> float:
        heldout.set_state(heldout.initial_state())
        right = count = 0.0
        for _ in range(heldout.num_batches()):
            values, weights = metrics_of(params, run.partitioner.global_batch(heldout.get_next()))[
                "preference_accuracy"]
            right, count = right + float(np.sum(values * weights)), count + float(np.sum(weights))
        assert count == heldout.num_rows == 48
        return right / count

    start = state = run.init_state()
    assert accuracy(start.params) == 0  # no pair preferred yet: rewards are all 0
    for i in range(30):
        state, metrics = step(state, run.partitioner.global_batch(run.train_input.get_next()))
        if i == 0:
            np.testing.assert_allclose(metrics["loss"], np.log(2), rtol=1e-6)
    assert accuracy(state.params) > 0.9
    # the reference's copy of the adapters is frozen where they started, with no optimizer state
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(state.params["reference"]),
                 jax.device_get(start.params["reference"]))
    assert not any("reference" in jax.tree_util.keystr(path) for path, _ in
                   jax.tree_util.tree_flatten_with_path(state.opt_state)[0])

    heldout.set_state(heldout.initial_state())
    batch = heldout.get_next()
    policy, reference = jax.jit(model.apply, static_argnames="method")(
        {"params": state.params}, batch, method="log_probs")
    flat = {k: v.reshape(-1, v.shape[-1]) for k, v in batch.items()}
    base = run.task.model.decoder.clone(lora_rank=0)
    logits = np.asarray(jax.jit(base.apply)(
        {"params": _base_params(jax.device_get(start.params["decoder"]))}, flat["ids"]))
    picked = np.take_along_axis(_log_softmax(logits), flat["labels"][..., None], -1)[..., 0]
    np.testing.assert_allclose(reference, (picked * flat["weights"]).sum(-1).reshape(-1, 2),
                               rtol=1e-5)
    assert np.abs(np.asarray(policy) - np.asarray(reference)).max() > 1.0


DPO_REFUSALS = [
    (["DPO_DATA='{bad}'", "LORA_RANK=2"],
     "{bad}:2: 'chosen' and 'rejected' are the same answer, so there is nothing to prefer"),
    (["DPO_DATA='{good}'", "DPO_EVAL_FRACTION=0", "DPO_BETA=0"],
     "DPO_BETA (beta) must be positive, got 0"),
]


def _refused_settings(folder: Path, sets: list[str], message: str) -> tuple[list[str], str]:
    """``sets`` and ``message`` with ``{good}`` and ``{bad}`` made files in ``folder``."""
    good = write_jsonl(folder / "good.jsonl", say_yes_or_no(40))
    bad = write_jsonl(folder / "bad.jsonl",
                      [GOOD, json.dumps({"prompt": "a", "chosen": "B", "rejected": "B"})])
    return ([item.format(good=good, bad=bad) for item in sets],
            message.format(good=good, bad=bad))


def test_pax_train_refuses_bad_dpo_data_in_one_line_writing_nothing(tmp_path):
    """Through the ``pax`` command; every refused setting is the next test's."""
    items, message = _refused_settings(tmp_path, *DPO_REFUSALS[0])
    result = run_pax("train", "--exp", "TinyLmForTests", "--job-dir", str(tmp_path / "job"),
                     *(a for item in items for a in ("--set", item)))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize(("sets", "message"), DPO_REFUSALS, ids=["same-answers", "beta"])
def test_each_bad_dpo_setting_is_refused_before_anything_is_written(host, tmp_path, capfd,
                                                                    sets, message):
    """``pax train`` in this process: the usage error (exit 2) that the command prints as its
    one line, and nothing else said (the test above)."""
    items, message = _refused_settings(tmp_path, sets, message)
    with pytest.raises(UsageError) as refused:
        train(host, exp="TinyLmForTests", plugin="lm", set_items=items,
              job_dir=str(tmp_path / "job"))
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert refused.value.exit_code == 2 and capfd.readouterr().err == ""
    assert not (tmp_path / "job").exists()


def _by_name(params: dict[str, np.ndarray], top: str) -> dict[str, np.ndarray]:
    """``read_params``'s arrays under ``['top']``, keyed by the rest of their path."""
    prefix = f"['{top}']"
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


@pytest.mark.slow
def test_dpo_from_a_lora_job_continues_its_adapters_against_that_jobs_model(tmp_path):
    """``--init-from`` a LoRA job: the adapters continue from the source's (not fresh), and
    the reference holds the source's adapters, so it is the source's model, not the base."""
    source, job = tmp_path / "sft", tmp_path / "dpo"
    common = ["--set", "LORA_RANK=2", "--set", "MAX_SEQ_LEN=32"]
    result = run_pax("train", "--exp", "TinyLmForTests", "--job-dir", str(source), *common,
                     "--set", "NUM_TRAIN_STEPS=3", "--set", "LEARNING_RATE=1e-2")
    assert result.returncode == 0, result.stderr
    pairs = write_jsonl(tmp_path / "p.jsonl", say_yes_or_no(40))
    result = run_pax("train", "--exp", "TinyLmForTests", "--job-dir", str(job), *common,
                     "--init-from", str(source), "--set", f"DPO_DATA='{pairs}'",
                     "--set", "NUM_TRAIN_STEPS=1", "--set", "LEARNING_RATE=1e-30",
                     "--set", "DPO_EVAL_FRACTION=0")
    assert result.returncode == 0, result.stderr
    trained, started = read_params(source), read_params(job)
    decoder, reference = _by_name(started, "decoder"), _by_name(started, "reference")
    adapters = {k for k in decoder if "['lora_" in k}
    assert adapters and set(reference) == adapters
    for name, value in _by_name(trained, "decoder").items():
        np.testing.assert_allclose(decoder[name], value, rtol=0, atol=1e-20, err_msg=name)
        if name in adapters:
            np.testing.assert_array_equal(reference[name], value, err_msg=name)
    assert all(np.abs(reference[k]).max() > 0 for k in adapters)


@pytest.mark.slow
def test_full_dpo_on_an_imported_job_holds_the_imported_weights_as_reference(tmp_path):
    """Without adapters every weight trains, and the reference is a frozen copy of the weights
    the job starts from: here an imported model's, filled from its weights-only step."""
    import tokenizers
    from test_hf_import_bad_input import _folder

    source, job = _folder(tmp_path), tmp_path / "job"
    words = tokenizers.Tokenizer.from_file(str(source / "tokenizer.json"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()  # answers are words w3, w4
    words.save(str(source / "tokenizer.json"))
    import_job(isolated_host(("lm", importlib.import_module("pax_lm.plugin"))),
               format_name="hf", source=str(source), output=str(job))
    imported = _by_name(read_params(job, step=0), "decoder")
    pairs = write_jsonl(tmp_path / "p.jsonl", [{"prompt": f"w{i % 7}", "chosen": "w3",
                                                "rejected": "w4"} for i in range(40)])
    result = run_pax("train", "--job-dir", str(job), "--set", f"DPO_DATA='{pairs}'",
                     "--set", "MAX_SEQ_LEN=32", "--set", "NUM_TRAIN_STEPS=2",
                     "--set", "DPO_EVAL_FRACTION=0", "--set", "LEARNING_RATE=1e-2")
    assert result.returncode == 0, result.stderr
    tuned = read_params(job, step=2)
    decoder, reference = _by_name(tuned, "decoder"), _by_name(tuned, "reference")
    assert set(decoder) == set(reference) == set(imported)
    for name, value in imported.items():
        np.testing.assert_array_equal(reference[name], value, err_msg=name)
    assert any(np.abs(decoder[k] - imported[k]).max() > 1e-4 for k in imported)
