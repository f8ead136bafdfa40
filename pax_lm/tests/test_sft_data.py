"""Fine-tuning data: conversations in JSONL become LM batches whose loss weights are 1 exactly on
the assistant's tokens, written with a model's own chat template (rendered progressively) or the
plain one; every bad line is one UsageError naming file and line, and `pax train` refuses it."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer as RustTokenizer
from tokenizers import decoders, models, pre_tokenizers

from pax_core import UsageError
from pax_core.testing import isolated_host, read_metrics, resolve, run_pax
from pax_lm.inputs.base import LmInput
from pax_lm.sft.chat_input import ChatInput
from pax_lm.sft.conversations import Conversation, read_conversations
from pax_lm.sft.templates import RENDER_TIME, JinjaTemplate, chat_template
from pax_lm.tokenizers import ByteTokenizer, HfTokenizer

BYTES = ByteTokenizer()
UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
LOWER = "abcdefghijklmnopqrstuvwxyz "

# A ChatML template as Qwen's models ship it, reduced to its turns: a default system turn, a
# refusal of a conversation that opens with the assistant.
CHATML = (
    "{% if messages and messages[0]['role'] == 'assistant' %}"
    "{{ raise_exception('Conversations must start with a user or system turn.') }}{% endif %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CHATML_SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
# Llama 3's layout: bos from tokenizer_config.json, headers, trimmed content, <|eot_id|>; empty
# system turns skipped with a loop control.
LLAMA3 = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' and not message['content'] %}{% continue %}{% endif %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
LLAMA3_SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>"]


def write_tokenizer(folder: Path, special: list[str], config: dict | None = None,
                    template_file: str | None = None) -> HfTokenizer:
    """A byte-level BPE tokenizer.json (the 256 byte symbols, no merges) with ``special`` as
    added tokens, and beside it a tokenizer_config.json and/or a chat_template.jinja."""
    folder.mkdir(parents=True, exist_ok=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = RustTokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)},
                                         merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(special)
    tokenizer.save(str(folder / "tokenizer.json"))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    if template_file is not None:
        (folder / "chat_template.jinja").write_text(template_file)
    return HfTokenizer(str(folder / "tokenizer.json"))


@pytest.fixture
def chatml(tmp_path) -> HfTokenizer:
    return write_tokenizer(tmp_path / "qwen", CHATML_SPECIAL,
                           {"chat_template": CHATML, "eos_token": "<|im_end|>",
                            "pad_token": "<|endoftext|>", "bos_token": None})


@pytest.fixture
def llama3(tmp_path) -> HfTokenizer:
    eot = {"__type": "AddedToken", "content": "<|eot_id|>", "lstrip": False, "rstrip": False}
    return write_tokenizer(tmp_path / "llama", LLAMA3_SPECIAL,
                           {"chat_template": LLAMA3, "bos_token": "<|begin_of_text|>",
                            "eos_token": eot})


def random_conversations(count: int, seed: int = 0) -> list[dict]:
    """Conversations in both JSONL forms, 1 to 3 exchanges, some with a system turn; users and
    systems write lowercase, assistants uppercase, so a token's case says whose it is."""
    rng = np.random.default_rng(seed)

    def text(letters: str, most: int) -> str:
        return "".join(rng.choice(list(letters), rng.integers(1, most)))

    rows = []
    for i in range(count):
        system = f"sys {i} " + text(LOWER, 20) if rng.random() < 0.5 else None
        if rng.random() < 0.4:
            row = {"prompt": f"q {i} " + text(LOWER, 30), "response": text(UPPER, 30)}
            rows.append(row if system is None else {"system": system, **row})
            continue
        messages = [] if system is None else [{"role": "system", "content": system}]
        for _ in range(rng.integers(1, 4)):
            messages += [{"role": "user", "content": f"q {i} " + text(LOWER, 30)},
                         {"role": "assistant", "content": text(UPPER, 30)}]
        rows.append({"messages": messages})
    return rows


def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def turns(row: dict) -> list[dict]:
    if "messages" in row:
        return row["messages"]
    system = [{"role": "system", "content": row["system"]}] if "system" in row else []
    return [*system, {"role": "user", "content": row["prompt"]},
            {"role": "assistant", "content": row["response"]}]


def expected_plain(row: dict) -> tuple[list[int], list[bool]]:
    """The plain template's tokens and trained flags, written out here by hand."""
    tokens, trained = [BYTES.bos_id], [False]
    for m in turns(row):
        if m["role"] == "assistant":
            head, body = BYTES.encode("<|assistant|>\n"), BYTES.encode(m["content"])
            tokens += head + body + [BYTES.eos_id]
            trained += [False] * len(head) + [True] * (len(body) + 1)
        else:
            head = BYTES.encode(f"<|{m['role']}|>\n{m['content']}\n")
            tokens += head
            trained += [False] * len(head)
    return tokens, trained


def expected_chatml(row: dict, tok: HfTokenizer) -> tuple[list[int], list[bool]]:
    """ChatML's tokens and trained flags: the answer, <|im_end|> and its newline are trained."""
    messages = turns(row)
    pieces = ([] if messages[0]["role"] == "system"
              else [("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n", False)])
    for m in messages:
        if m["role"] == "assistant":
            pieces += [("<|im_start|>assistant\n", False), (m["content"] + "<|im_end|>\n", True)]
        else:
            pieces.append((f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n", False))
    tokens, trained = [], []
    for text, train in pieces:
        ids = tok.encode(text)
        tokens += ids
        trained += [train] * len(ids)
    return tokens, trained


def make(path: str, tokenizer=BYTES, **kwargs) -> ChatInput:
    settings = {"batch_size": 2, "seq_len": 256, "eval_fraction": 0.0, "shuffle": False,
                "repeat": False, **kwargs}
    return ChatInput(path=path, tokenizer=tokenizer, **settings)


def all_batches(data: ChatInput) -> list[dict[str, np.ndarray]]:
    batches = []
    while True:
        try:
            batches.append(data.get_next())
        except StopIteration:
            return batches


def segments(batches) -> list[tuple[tuple[int, ...], tuple[float, ...]]]:
    """Each segment of every row: its tokens (inputs, then the last label) and the weights of
    its predictions."""
    found = []
    for batch in batches:
        for row in range(len(batch["ids"])):
            for s in np.unique(batch["segment_ids"][row]):
                if s == 0:
                    continue
                mask = batch["segment_ids"][row] == s
                ids, labels = batch["ids"][row][mask], batch["labels"][row][mask]
                np.testing.assert_array_equal(batch["segment_pos"][row][mask],
                                              np.arange(mask.sum()))
                found.append((tuple([*ids.tolist(), int(labels[-1])]),
                              tuple(batch["weights"][row][mask].tolist())))
    return found


def as_segment(tokens: list[int], trained: list[bool]) -> tuple[tuple[int, ...], tuple]:
    return tuple(tokens), tuple(float(t) for t in trained[1:])  # a prediction's weight: its label's


def test_batches_have_exactly_the_lm_keys_shapes_and_dtypes(tmp_path):
    data = make(write_jsonl(tmp_path / "c.jsonl", random_conversations(20)), seq_len=64)
    batch = data.get_next()
    abstract = LmInput.abstract_batch(data)
    assert set(batch) == set(abstract)
    for key, spec in abstract.items():
        assert batch[key].shape == spec.shape and batch[key].dtype == spec.dtype, key


def test_plain_template_weights_exactly_the_answers_and_their_eos(tmp_path):
    rows = random_conversations(60)
    batches = all_batches(make(write_jsonl(tmp_path / "c.jsonl", rows)))
    assert sorted(segments(batches)) == sorted(as_segment(*expected_plain(r)) for r in rows)
    for batch in batches:  # and by whose token it is: uppercase (an answer) or eos, nothing else
        answer = np.isin(batch["labels"], [*BYTES.encode(UPPER), BYTES.eos_id])
        np.testing.assert_array_equal(batch["weights"] == 1, answer & (batch["segment_ids"] > 0))
        assert set(np.unique(batch["weights"])) <= {0.0, 1.0}


def test_chatml_template_is_rendered_progressively_into_assistant_masks(tmp_path, chatml):
    rows = random_conversations(40)
    batches = all_batches(make(write_jsonl(tmp_path / "c.jsonl", rows), tokenizer=chatml))
    assert sorted(segments(batches)) == sorted(as_segment(*expected_chatml(r, chatml))
                                               for r in rows)


def test_llama3_template_takes_bos_and_added_token_objects_from_tokenizer_config(tmp_path,
                                                                                   llama3):
    conversation = {"messages": [{"role": "system", "content": ""},
                                 {"role": "user", "content": "  hi  "},
                                 {"role": "assistant", "content": "OK "},
                                 {"role": "user", "content": "more"},
                                 {"role": "assistant", "content": "DONE"}]}
    pieces = [("<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n", False),
              ("OK<|eot_id|>", True),
              ("<|start_header_id|>user<|end_header_id|>\n\nmore<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n", False),
              ("DONE<|eot_id|>", True)]
    tokens = [t for text, _ in pieces for t in llama3.encode(text)]
    trained = [train for text, train in pieces for _ in llama3.encode(text)]
    assert tokens[0] == 256 and tokens.count(260) == 4  # <|begin_of_text|>, <|eot_id|> ids
    batches = all_batches(make(write_jsonl(tmp_path / "c.jsonl", [conversation] * 2),
                               tokenizer=llama3, batch_size=1))
    assert segments(batches) == [as_segment(tokens, trained)] * 2


def test_both_jsonl_forms_make_the_same_rows(tmp_path, chatml):
    short = [{"system": "be brief", "prompt": "hi", "response": "HELLO"},
             {"prompt": "x", "response": "Y"}]
    long = [{"messages": turns(r)} for r in short]
    for tokenizer in (BYTES, chatml):
        a = make(write_jsonl(tmp_path / "a.jsonl", short), tokenizer=tokenizer, batch_size=1)
        b = make(write_jsonl(tmp_path / "b.jsonl", long), tokenizer=tokenizer, batch_size=1)
        for x, y in zip(all_batches(a), all_batches(b), strict=True):
            for key in x:
                np.testing.assert_array_equal(x[key], y[key])


def test_multi_turn_trains_every_answer_and_no_turn_between(tmp_path):
    row = {"messages": [{"role": "user", "content": "aa"}, {"role": "assistant", "content": "B"},
                        {"role": "user", "content": "cc"}, {"role": "assistant", "content": "D"},
                        {"role": "user", "content": "ignored"}]}
    batch = make(write_jsonl(tmp_path / "c.jsonl", [row]), batch_size=1).get_next()
    trained = batch["labels"][0][batch["weights"][0] == 1]
    assert trained.tolist() == [*BYTES.encode("B"), BYTES.eos_id, *BYTES.encode("D"),
                                BYTES.eos_id]
    # the trailing user turn is left out: it trains nothing
    assert BYTES.decode(batch["labels"][0]) == ("<|user|>\naa\n<|assistant|>\nB<|user|>\ncc\n"
                                                "<|assistant|>\nD")


def test_packed_conversations_never_share_a_segment_and_long_ones_are_cut(tmp_path):
    rows = random_conversations(50, seed=3)
    rows.append({"prompt": "p" * 30, "response": "L" * 150})  # longer than a row: cut in pieces
    data = make(write_jsonl(tmp_path / "c.jsonl", rows), seq_len=48)
    batches = all_batches(data)
    shared = 0
    for batch in batches:
        for row in range(len(batch["ids"])):
            ids = [s for s in np.unique(batch["segment_ids"][row]) if s]
            shared += len(ids) > 1
            for s in ids:  # a segment starts at position 0 and holds one conversation's tokens
                mask = batch["segment_ids"][row] == s
                np.testing.assert_array_equal(batch["segment_pos"][row][mask],
                                              np.arange(mask.sum()))
                assert (batch["ids"][row][mask] == BYTES.bos_id).sum() <= 1
                if (batch["ids"][row][mask] == BYTES.bos_id).any():
                    assert batch["ids"][row][mask][0] == BYTES.bos_id
    assert shared > 0  # some rows hold several conversations
    total = sum(float(b["weights"].sum()) for b in batches)
    assert total == sum(sum(expected_plain(r)[1][1:]) for r in rows)  # each answer token once


def test_bos_never_follows_another_conversation_in_a_segment(tmp_path):
    # Two tiny conversations fit one row; each is its own segment, so attention cannot cross.
    rows = [{"prompt": "a", "response": "B"}, {"prompt": "c", "response": "D"}]
    batch = make(write_jsonl(tmp_path / "c.jsonl", rows), batch_size=1, seq_len=64).get_next()
    segment_ids = batch["segment_ids"][0]
    first = segment_ids[batch["ids"][0] == BYTES.bos_id]
    assert len(first) == 2 and first[0] != first[1]
    assert set(np.unique(segment_ids)) == {0, 1, 2}


def test_held_out_split_is_by_hash_and_disjoint(tmp_path):
    rows = random_conversations(100, seed=5)
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    reordered = write_jsonl(tmp_path / "r.jsonl", rows[::-1])

    def split(p: str, name: str) -> list[str]:
        data = make(p, split=name, eval_fraction=0.1, batch_size=1, seq_len=512)
        return [BYTES.decode(tokens) for tokens, _ in segments(all_batches(data))]

    held_out, train = split(path, "eval"), split(path, "train")
    assert len(held_out) == 10 and len(train) == 90 and not set(held_out) & set(train)
    assert sorted(split(reordered, "eval")) == sorted(held_out)


def test_finite_input_pads_its_last_batch_with_weightless_rows(tmp_path):
    rows = [{"prompt": "a" * 10, "response": "B" * 20}] * 5  # one row each at seq_len 64
    data = make(write_jsonl(tmp_path / "c.jsonl", rows), batch_size=4, seq_len=64)
    batches = all_batches(data)
    assert len(batches) == 2 and data.num_rows == 5
    assert batches[1]["weights"][1:].sum() == 0 and (batches[1]["segment_ids"][1:] == 0).all()
    assert batches[1]["weights"][0].sum() == 21


def test_position_resumes_on_the_same_batches(tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", random_conversations(80))
    first = ChatInput(path=path, batch_size=2, seq_len=64, seed=7)
    [first.get_next() for _ in range(3)]
    state, expected = first.get_state(), first.get_next()
    second = ChatInput(path=path, batch_size=2, seq_len=64, seed=7)
    second.set_state(state)
    got = second.get_next()
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key])


def test_split_too_small_for_a_batch_is_refused(tmp_path):
    data = make(write_jsonl(tmp_path / "c.jsonl", random_conversations(4)), batch_size=64)
    with pytest.raises(UsageError, match=r"fewer than batch_size 64; .* or give more "
                                         r"conversations$"):
        data.check()


def test_template_file_beside_the_tokenizer_and_named_list_form(tmp_path):
    rows = random_conversations(10)
    path = write_jsonl(tmp_path / "c.jsonl", rows)
    own = write_tokenizer(tmp_path / "a", CHATML_SPECIAL, {"chat_template": CHATML})
    want = sorted(segments(all_batches(make(path, tokenizer=own))))
    listed = write_tokenizer(tmp_path / "b", CHATML_SPECIAL, {"chat_template": [
        {"name": "tool_use", "template": "{{ raise_exception('not this one') }}"},
        {"name": "default", "template": CHATML}]})
    beside = write_tokenizer(tmp_path / "c", CHATML_SPECIAL, None, template_file=CHATML)
    given = write_tokenizer(tmp_path / "d", CHATML_SPECIAL, {"chat_template": "{{ oops }"})
    (tmp_path / "t.jinja").write_text(CHATML)
    for tokenizer, spec in ((listed, None), (beside, None), (given, str(tmp_path / "t.jinja"))):
        assert sorted(segments(all_batches(make(path, tokenizer=tokenizer,
                                                chat_template=spec)))) == want
    # "plain" overrides a tokenizer's own; a tokenizer without one gets the plain template
    plain = write_tokenizer(tmp_path / "e", CHATML_SPECIAL)
    for tokenizer, spec in ((listed, "plain"), (plain, None)):
        text = [plain.decode(t) for t, _ in segments(all_batches(make(path, tokenizer=tokenizer,
                                                                      chat_template=spec)))]
        assert all(t.startswith(("<|user|>\n", "<|system|>\n")) for t in text)


def test_jinja_environment_is_transformers(tmp_path):
    template = JinjaTemplate(
        "{{ messages[0]['content'] | tojson }} {{ strftime_now('%Y-%m-%d') }} {{ eos_token }}"
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}|{{ m.role }}"
        "{% endfor %}\n  {% if add_generation_prompt %}\nGEN\n  {% endif %}\n",
        "t.jinja", {"eos_token": "</s>"})
    conversation = Conversation(({"role": "user", "content": "é<b>&"},
                                 {"role": "assistant", "content": "X"}), "c.jsonl:1")
    rendered = template.render(conversation.messages, True, conversation)
    # tojson keeps non-ASCII and HTML as they are; lstrip_blocks drops the spaces before a
    # block tag, trim_blocks the newline after it; the loop breaks after one message
    assert rendered == f'"é<b>&" {RENDER_TIME:%Y-%m-%d} </s>|userGEN\n'


def test_hf_tokenizer_reads_special_token_text_as_its_id(chatml):
    im_start, im_end = chatml.encode("<|im_start|>"), chatml.encode("<|im_end|>")
    assert im_start == [256] and im_end == [257] and chatml.eos_id == 258
    assert chatml.encode("a<|im_end|>b") == [*chatml.encode("a"), 257, *chatml.encode("b")]
    assert chatml.decode(chatml.encode("<|im_start|>user\nhé")) == "<|im_start|>user\nhé"


BAD_TEMPLATES = [
    # a template that rewrites an earlier answer once a later turn exists (as Qwen3 drops past
    # reasoning): the later prefix does not extend what was rendered
    ("{% for m in messages %}<{{ m.role }}>"
     "{% if m.role == 'assistant' and not loop.last %}...{% else %}{{ m.content }}{% endif %}"
     "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
     "does not render progressively"),
    ("{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}{% endif %}"
     "{% endfor %}", "writes nothing for assistant turn 2"),
    ("{{ raise_exception('Only user and assistant roles are supported!\nreally') }}",
     "refuses the conversation: Only user and assistant roles are supported! really$"),
    ("{% for m in messages %}{{ m.content + 1 }}{% endfor %}",
     r"fails to render the conversation \(TypeError"),
    ("{% for m in messages %}", r"does not compile: .*\(line 1\); fix it"),
]


@pytest.mark.parametrize(("source", "message"), BAD_TEMPLATES)
def test_bad_templates_are_one_line_naming_template_and_line(tmp_path, chatml, source, message):
    rows = [{"prompt": "p", "response": "R"},
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "B"},
                          {"role": "user", "content": "c"}, {"role": "assistant", "content": "D"}]}]
    (tmp_path / "bad.jinja").write_text(source)
    data = make(write_jsonl(tmp_path / "c.jsonl", rows), tokenizer=chatml,
                chat_template=str(tmp_path / "bad.jinja"))
    with pytest.raises(UsageError, match=message) as error:
        data.check()
    text = str(error.value)
    assert "\n" not in text and str(tmp_path / "bad.jinja") in text
    if "compile" not in message:
        assert text.startswith(f"{tmp_path / 'c.jsonl'}:")


def test_template_refusal_from_tokenizer_config_names_it(tmp_path, chatml):
    data = make(write_jsonl(tmp_path / "c.jsonl", [{"messages": [
        {"role": "assistant", "content": "HI"}]}]), tokenizer=chatml)
    with pytest.raises(UsageError, match=r"c.jsonl:1: the chat template of .*tokenizer_config"
                                         r".json refuses the conversation: Conversations must"):
        data.check()


def test_a_template_file_needs_a_hugging_face_tokenizer(tmp_path):
    (tmp_path / "t.jinja").write_text(CHATML)
    path = write_jsonl(tmp_path / "c.jsonl", [{"prompt": "a", "response": "B"}])
    with pytest.raises(UsageError, match="needs a Hugging Face tokenizer"):
        make(path, chat_template=str(tmp_path / "t.jinja")).check()
    with pytest.raises(UsageError, match=r"chat template not found: .*nope\.jinja"):
        chat_template(write_tokenizer(tmp_path / "x", CHATML_SPECIAL),
                      str(tmp_path / "nope.jinja"))


GOOD = json.dumps({"prompt": "a", "response": "B"})
BAD_LINES = [
    ("{not json", r"invalid JSON \(Expecting property name"),
    ("[1, 2]", "a JSON array, not an object"),
    ('{"text": "hello"}', r"neither form of conversation \(fields: text\)"),
    ('{"prompt": "a"}', r"neither form of conversation \(fields: prompt\)"),
    ('{"messages": [], "prompt": "a", "response": "b"}', "both 'messages' and 'prompt'"),
    ('{"messages": "hi"}', "'messages' is a JSON string, not a list"),
    ('{"messages": []}', "the conversation has no messages"),
    ('{"messages": ["hi"]}', "message 1 is a JSON string, not an object"),
    ('{"messages": [{"content": "hi"}]}', "message 1 has no 'role'; give it one of system, user"),
    ('{"messages": [{"role": "tool", "content": "x"}]}', "message 1 has role 'tool'; use one of"),
    ('{"messages": [{"role": "user", "content": ["x"]}]}',
     r"message 1 \(user\) has content of JSON array; give its text as a string"),
    ('{"messages": [{"role": "user"}]}', r"message 1 \(user\) has no 'content'"),
    ('{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": " "}]}',
     r"message 2 \(assistant\) is empty"),
    ('{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "x"}]}',
     "has no assistant turn"),
    ('{"prompt": "a", "response": ""}', "the response is empty"),
    ('{"prompt": 3, "response": "b"}', "'prompt' is a JSON number, not a string"),
    ('{"system": ["s"], "prompt": "a", "response": "b"}', "'system' is a JSON array"),
]


@pytest.mark.parametrize(("line", "message"), BAD_LINES)
def test_bad_lines_are_one_usage_error_naming_file_and_line(tmp_path, line, message):
    path = write_jsonl(tmp_path / "c.jsonl", [GOOD, "", line, GOOD])
    with pytest.raises(UsageError, match=message) as error:
        read_conversations(tmp_path)
    assert str(error.value).startswith(f"{path}:3: ") and "\n" not in str(error.value)


def test_missing_and_empty_sources_are_refused(tmp_path):
    with pytest.raises(UsageError, match="no such file or folder"):
        read_conversations(tmp_path / "none.jsonl")
    with pytest.raises(UsageError, match=r"no \.jsonl files under"):
        read_conversations(tmp_path)
    write_jsonl(tmp_path / "c.jsonl", ["", "  "])
    with pytest.raises(UsageError, match="no conversations in"):
        read_conversations(tmp_path)
    with pytest.raises(UsageError, match=r"path must name a \.jsonl file"):
        ChatInput()


@pytest.fixture(scope="module")
def host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")),
                         ("transformer", importlib.import_module("pax_transformer.plugin")))


def test_text_experiments_take_sft_data(host, tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", random_conversations(10))
    config = resolve(host, "TinyLmForTests", "lm", [f"SFT_DATA='{path}'",
                                                    "CHAT_TEMPLATE='plain'"]).config
    assert [(d.__fn_or_cls__, d.split, d.path, d.chat_template) for d in config.datasets] == [
        (ChatInput, "train", path, "plain"), (ChatInput, "eval", path, "plain")]
    config = resolve(host, "TinyLmForTests", "lm", [f"SFT_DATA='{path}'",
                                                    "SFT_EVAL_FRACTION=0"]).config
    assert [d.name for d in config.datasets] == ["train"]
    for other in ("CORPUS_PATH='x.txt'", "TRAIN_DATA='prepared'"):
        with pytest.raises(UsageError, match=r"give SFT_DATA .* not both"):
            resolve(host, "TinyLmForTests", "lm", [f"SFT_DATA='{path}'", other])


def test_pax_train_fine_tunes_on_conversations_with_the_models_template(tmp_path):
    """A tiny LM with a ChatML tokenizer trains a few steps on assistant tokens only: the
    steps' prediction counts are the answer tokens of their batches."""
    tokenizer = write_tokenizer(tmp_path / "tok", CHATML_SPECIAL,
                                {"chat_template": CHATML, "eos_token": "<|im_end|>"})
    path = write_jsonl(tmp_path / "chat.jsonl", random_conversations(120, seed=9))
    job = tmp_path / "job"
    result = run_pax("train", "--exp", "TinyLmForTests", "--job-dir", str(job),
                     "--set", f"SFT_DATA='{path}'", "--set", f"TOKENIZER='{tokenizer.name}'",
                     "--set", "VOCAB_SIZE=259", "--set", "MAX_SEQ_LEN=64",
                     "--set", "NUM_TRAIN_STEPS=3", "--set", "SUMMARY_INTERVAL_STEPS=1",
                     "--set", "EVAL_INTERVAL_STEPS=3", "--set", "SFT_EVAL_FRACTION=0.1",
                     timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_metrics(job)
    train = [r for r in records if r["kind"] == "train"]
    data = ChatInput(path=path, tokenizer=tokenizer, seq_len=64, batch_size=8, seed=1234,
                     eval_fraction=0.1)
    expected = [float(data.get_next()["weights"].sum()) for _ in range(3)]
    assert [r["num_predictions"] for r in train] == expected
    assert all(np.isfinite(r["loss"]) for r in train)
    assert any(r["kind"] == "eval/heldout" for r in records)


@pytest.mark.parametrize(("sets", "message"), [
    (["SFT_DATA='{bad}'"], "{bad}:2: message 1 has role 'bot'; use one of system, user, assistant"),
    (["SFT_DATA='{good}'", "CORPUS_PATH='{good}'"], "give SFT_DATA (conversations) or"),
    (["SFT_DATA='{good}'", "CHAT_TEMPLATE='{good}.jinja'"], "chat template not found"),
])
def test_pax_train_refuses_bad_sft_data_in_one_line_writing_nothing(tmp_path, sets, message):
    good = write_jsonl(tmp_path / "good.jsonl", [GOOD] * 40)
    bad = write_jsonl(tmp_path / "bad.jsonl",
                      [GOOD, '{"messages": [{"role": "bot", "content": "x"}]}'])
    tokenizer = write_tokenizer(tmp_path / "tok", CHATML_SPECIAL)
    items = [s.format(good=good, bad=bad) for s in sets] + [f"TOKENIZER='{tokenizer.name}'",
                                                            "VOCAB_SIZE=259"]
    args = [a for item in items for a in ("--set", item)]
    result = run_pax("train", "--exp", "TinyLmForTests", "--job-dir", str(tmp_path / "job"),
                     *args)
    assert result.returncode == 2, result.stderr
    assert message.format(good=good, bad=bad) in result.stderr
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "job").exists()
