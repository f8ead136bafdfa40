"""pax data prepare --chat: conversations stored as their chat template's tokens with loss masks,
streamed as SFT_DATA into exactly ChatInput's batches, bad lines refused as ChatInput refuses
them with nothing left behind, an interrupted preparation resumed, and each mix-up of text and
conversations refused in one line."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
from test_data_prepare import interrupt
from test_sft_data import (
    BAD_LINES,
    CHATML,
    CHATML_SPECIAL,
    GOOD,
    UPPER,
    all_batches,
    as_segment,
    expected_chatml,
    expected_plain,
    random_conversations,
    segments,
    write_jsonl,
    write_tokenizer,
)

from pax_core import UsageError
from pax_core.testing import isolated_host, resolve, run_pax
from pax_lm.data.shards import PreparedDataset
from pax_lm.inputs.tokens import TokensInput
from pax_lm.preparation import prepare
from pax_lm.sft.chat_input import ChatInput
from pax_lm.sft.prepared import PreparedChatInput
from pax_lm.tokenizers import ByteTokenizer

BYTES = ByteTokenizer()
SHARD_MB = 0.002  # a few kilobytes: several shards of tiny sets


@pytest.fixture(scope="module")
def chats(tmp_path_factory) -> dict[str, object]:
    """150 conversations in JSON lines, prepared in several shards with the bytes tokenizer."""
    root = tmp_path_factory.mktemp("chats")
    rows = random_conversations(150, seed=11)
    source = write_jsonl(root / "chat.jsonl", rows)
    prepare(source, root / "prepared", shard_mb=SHARD_MB, workers=0, chat=True)
    return {"rows": rows, "source": source, "prepared": str(root / "prepared")}


def both(chats, **settings) -> tuple[list[dict], list[dict]]:
    """Every batch of ChatInput on the source and of PreparedChatInput on the prepared set."""
    settings = {"batch_size": 4, "seq_len": 64, "shuffle": False, "repeat": False, **settings}
    return (all_batches(ChatInput(path=chats["source"], **settings)),
            all_batches(PreparedChatInput(path=chats["prepared"], **settings)))


@pytest.mark.parametrize("packing", ["pack", "concat"])
def test_streamed_batches_are_chat_inputs_for_every_split(chats, packing):
    data = PreparedDataset.open(chats["prepared"], content=None)
    assert len(data.shards) > 2 and data.loss_mask and data.num_documents == 150
    assert data.metadata["chat_template"] == {"name": "plain", "fingerprint": "plain"}
    for split, fraction in (("train", 0.0), ("train", 0.1), ("eval", 0.1)):
        expected, got = both(chats, packing=packing, split=split, eval_fraction=fraction)
        assert len(got) == len(expected) > 2, split
        for a, b in zip(expected, got, strict=True):
            assert set(a) == set(b)
            for key in a:
                assert a[key].dtype == b[key].dtype, key
                np.testing.assert_array_equal(a[key], b[key], err_msg=f"{split} {key}")
    held_out = segments(both(chats, split="eval", eval_fraction=0.1, seq_len=512)[1])
    assert len(held_out) == 15  # a tenth of the conversations, as ChatInput holds out


def test_a_shuffled_stream_trains_each_conversations_answers_and_nothing_else(chats):
    def stream(shuffle: bool) -> list[dict]:
        return all_batches(PreparedChatInput(path=chats["prepared"], batch_size=4, seq_len=256,
                                             shuffle=shuffle, repeat=False, eval_fraction=0.0,
                                             seed=3))

    batches = stream(shuffle=True)
    # every conversation once, weighted as ChatInput weights it, in another order
    assert sorted(segments(batches)) == sorted(as_segment(*expected_plain(r))
                                               for r in chats["rows"])
    assert segments(batches) != segments(stream(shuffle=False))
    for batch in batches:  # a label weighs 1 exactly when it is an answer's (uppercase, eos)
        answer = np.isin(batch["labels"], [*BYTES.encode(UPPER), BYTES.eos_id])
        np.testing.assert_array_equal(batch["weights"] == 1,
                                      answer & (batch["segment_ids"] > 0))
    training = PreparedChatInput(path=chats["prepared"], batch_size=4, seq_len=48,
                                 is_training=True, eval_fraction=0.1)
    for _ in range(3):
        batch = training.get_next()
        answer = np.isin(batch["labels"], [*BYTES.encode(UPPER), BYTES.eos_id])
        assert batch["weights"].sum() > 0
        assert not (batch["weights"] * ~answer).any()


def test_a_models_own_template_is_prepared_with_workers(tmp_path):
    chatml = write_tokenizer(tmp_path / "qwen", CHATML_SPECIAL,
                             {"chat_template": CHATML, "eos_token": "<|im_end|>",
                              "pad_token": "<|endoftext|>"})
    rows = random_conversations(30, seed=4)
    source = write_jsonl(tmp_path / "c.jsonl", rows)
    prepare(source, tmp_path / "one", chatml.name, shard_mb=0.0005, workers=0, chat=True)
    prepare(source, tmp_path / "two", chatml.name, shard_mb=0.0005, workers=1, chat=True)
    one, two = (PreparedDataset.open(tmp_path / d, content=None) for d in ("one", "two"))
    assert len(one.shards) > 1 and one.shards == two.shards
    assert one.chat_template["name"].endswith("tokenizer_config.json")
    for shard in one.shards:
        assert (tmp_path / "one" / shard.name).read_bytes() == (
            tmp_path / "two" / shard.name).read_bytes()
    batches = all_batches(PreparedChatInput(path=str(tmp_path / "two"), tokenizer=chatml,
                                            batch_size=2, seq_len=512, eval_fraction=0.0,
                                            repeat=False))
    assert sorted(segments(batches)) == sorted(as_segment(*expected_chatml(r, chatml))
                                               for r in rows)


@pytest.mark.parametrize(("line", "message"), [BAD_LINES[i] for i in (0, 2, 8, 13)])
def test_bad_lines_are_refused_as_chat_input_refuses_them_leaving_nothing(tmp_path, line,
                                                                          message):
    source = write_jsonl(tmp_path / "c.jsonl", [*random_conversations(100), line, GOOD])
    with pytest.raises(UsageError) as refused:
        ChatInput(path=source).check()
    shards = []
    with pytest.raises(UsageError, match=message) as error:
        prepare(source, tmp_path / "out", shard_mb=SHARD_MB, workers=0, chat=True,
                on_shard=lambda record, seconds: shards.append(record))
    assert str(error.value) == str(refused.value)
    assert str(error.value).startswith(f"{source}:101: ")
    assert shards  # shards were written before the bad line, and went with the rest
    assert not (tmp_path / "out").exists()


def test_a_template_refusal_in_a_worker_leaves_nothing(tmp_path):
    chatml = write_tokenizer(tmp_path / "qwen", CHATML_SPECIAL, {"chat_template": CHATML})
    rows = [*random_conversations(60),
            json.dumps({"messages": [{"role": "assistant", "content": "HI"}]})]
    source = write_jsonl(tmp_path / "c.jsonl", rows)
    with pytest.raises(UsageError) as refused:
        ChatInput(path=source, tokenizer=chatml, eval_fraction=0.0).check()
    with pytest.raises(UsageError, match="refuses the conversation") as error:
        prepare(source, tmp_path / "out", chatml.name, shard_mb=SHARD_MB, workers=1, chat=True)
    assert str(error.value) == str(refused.value)
    assert not (tmp_path / "out").exists()


def test_an_interrupted_preparation_resumes_keeping_finished_shards(tmp_path, chats):
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        prepare(chats["source"], out, shard_mb=SHARD_MB, workers=0, chat=True,
                on_shard=interrupt)
    first = out / "shards" / "tokens-00000.array_record"
    made = first.stat().st_mtime_ns
    with pytest.raises(UsageError, match=r"unfinished preparation of other settings: .*"
                                         r"--chat/--chat-template"):
        prepare(chats["source"], out, shard_mb=SHARD_MB, workers=0)
    prepare(chats["source"], out, shard_mb=SHARD_MB, workers=0, chat=True)
    assert first.stat().st_mtime_ns == made  # kept, not written again
    whole, resumed = (PreparedDataset.open(p, content=None) for p in (chats["prepared"], out))
    assert resumed.shards == whole.shards
    np.testing.assert_array_equal(resumed.hashes, whole.hashes)
    documents = list(range(whole.num_documents))
    for (a, ma), (b, mb) in zip(whole.masked_tokens(documents), resumed.masked_tokens(documents),
                                strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ma, mb)


def test_text_and_conversations_are_not_mixed_up(tmp_path, chats):
    (tmp_path / "docs.jsonl").write_text(json.dumps({"text": "some text " * 20}) + "\n")
    prepare(tmp_path / "docs.jsonl", tmp_path / "text", workers=0)
    with pytest.raises(UsageError, match=r"holds text \(prepared without --chat\), not "
                                         r"conversations; prepare the conversations with pax "
                                         r"data prepare SRC --chat"):
        PreparedChatInput(path=str(tmp_path / "text")).check()
    with pytest.raises(UsageError, match=r"holds conversations with loss masks \(pax data "
                                         r"prepare --chat\), not text to pretrain on"):
        TokensInput(path=chats["prepared"]).check()
    with pytest.raises(UsageError, match="--chat-template writes conversations: add --chat"):
        prepare(chats["source"], tmp_path / "x", chat=False, template="plain")
    with pytest.raises(UsageError, match="--pattern picks text sources"):
        prepare(chats["source"], tmp_path / "x", chat=True, pattern="*.jsonl")
    assert not (tmp_path / "x").exists()


def test_a_set_written_with_another_template_or_tokenizer_is_refused(tmp_path, chats):
    chatml = write_tokenizer(tmp_path / "qwen", CHATML_SPECIAL, {"chat_template": CHATML})
    source = write_jsonl(tmp_path / "c.jsonl", random_conversations(10))
    prepare(source, tmp_path / "plain", chatml.name, workers=0, chat=True, template="plain")
    with pytest.raises(UsageError, match=r"was written with the chat template plain \(plain\), "
                                         r"not the experiment's of .*tokenizer_config.json .*; "
                                         r"prepare it again without --chat-template"):
        PreparedChatInput(path=str(tmp_path / "plain"), tokenizer=chatml).check()
    PreparedChatInput(path=str(tmp_path / "plain"), tokenizer=chatml,
                      chat_template="plain").check()
    with pytest.raises(UsageError, match="was prepared with tokenizer bytes"):
        PreparedChatInput(path=chats["prepared"], tokenizer=chatml, chat_template="plain").check()


def test_sft_data_names_a_prepared_folder_or_conversations(chats):
    host = isolated_host(("lm", importlib.import_module("pax_lm.plugin")),
                         ("transformer", importlib.import_module("pax_transformer.plugin")))
    config = resolve(host, "TinyLmForTests", "lm", [f"SFT_DATA='{chats['prepared']}'",
                                                    "INPUT_WORKERS=2"]).config
    assert [(d.__fn_or_cls__, d.split, d.num_workers) for d in config.datasets] == [
        (PreparedChatInput, "train", 2), (PreparedChatInput, "eval", 0)]
    config = resolve(host, "TinyLmForTests", "lm", [f"SFT_DATA='{chats['source']}'"]).config
    assert [d.__fn_or_cls__ for d in config.datasets] == [ChatInput, ChatInput]


@pytest.mark.slow
def test_command_line_prepares_inspects_and_refuses(tmp_path, chats):
    out = tmp_path / "out"
    result = run_pax("data", "prepare", chats["source"], "--output", str(out), "--chat",
                     "--chat-template", "plain", "--workers", "0")
    assert result.returncode == 0, result.stderr
    assert "prepared 150 conversations" in result.stdout
    result = run_pax("data", "inspect", str(out), "--records", "1", "--verify")
    assert result.returncode == 0, result.stderr
    trained = sum(expected_plain(chats["rows"][0])[1])
    assert "written with the chat template plain" in result.stdout
    assert f"[0] {len(expected_plain(chats['rows'][0])[0])} tokens ({trained} trained)" in (
        result.stdout)
    bad = write_jsonl(tmp_path / "bad.jsonl", [GOOD, '{"messages": [{"role": "bot"}]}'])
    result = run_pax("data", "prepare", bad, "--chat", "--output", str(tmp_path / "no"))
    assert result.returncode == 2, result.stderr
    assert f"{bad}:2: message 1 has role 'bot'" in result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "no").exists()
