"""``pax serve``: a real server on 127.0.0.1 answering OpenAI's own Python client.

One server (a ``pax serve`` process over a tiny trained LM, an API key required, 4 slots and a
queue of 4) serves the module; the last test stops it with SIGTERM. What each request gets is
checked against the decoding engine run in this process on the same checkpoint, one request at
a time.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from pax_core.testing import isolated_host, train

KEY = "test-key"
SLOTS, MAX_WAITING = 4, 4
MAX_SEQ_LEN = 96
PROMPTS = ["And God said", "In the beginning", "Let there be", "and the earth", "And it was so",
           "the waters", "And the evening", "light"]


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    job_dir = tmp_path_factory.mktemp("served") / "tiny"
    train(isolated_host(("lm", importlib.import_module("pax_lm.plugin"))), exp="TinyLmForTests",
          plugin="lm", set_items=["NUM_TRAIN_STEPS=20", f"MAX_SEQ_LEN={MAX_SEQ_LEN}"],
          job_dir=str(job_dir))
    return job_dir


@pytest.fixture(scope="module")
def server(job, tmp_path_factory):
    """The ``pax serve`` process, its base URL and the file of its standard error; killed at
    the end if a test has not stopped it."""
    errors = tmp_path_factory.mktemp("serve") / "stderr.txt"
    with open(errors, "w") as stderr:
        process = subprocess.Popen(
            [str(Path(sys.executable).with_name("pax")), "serve", "--job-dir", str(job),
             "--port", "0", "--slots", str(SLOTS), "--max-waiting", str(MAX_WAITING)],
            stdout=subprocess.PIPE, stderr=stderr, text=True,
            env={**os.environ, "PAX_API_KEY": KEY})
    line = process.stdout.readline()
    if "serving" not in line:
        process.kill()
        pytest.fail(f"pax serve did not start: {line}{errors.read_text()}")
    port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
    yield process, f"http://127.0.0.1:{port}/v1", errors
    if process.poll() is None:
        process.kill()
    process.wait()


@pytest.fixture(scope="module")
def reference(job):
    """What the engine in this process gives a prompt alone: ``complete(ids, settings)``, the
    tokenizer and the chat template."""
    from pax_core import restore_latest
    from pax_lm.inference import Batcher, Engine, Request
    from pax_lm.sft.templates import chat_template

    run, state, _ = restore_latest(isolated_host(("lm", importlib.import_module("pax_lm.plugin"))),
                                   exp=None, plugin=None, set_items=[], job_dir=str(job))
    tokenizer = run.train_input.tokenizer
    variables = {k: v["decoder"] for k, v in run.eval_variables(state).items() if "decoder" in v}
    batcher = Batcher(Engine(run.task.model.decoder, variables, slots=1), tokenizer.decode)

    def complete(ids, settings):
        settings = dataclasses.replace(settings, stop_ids=(tokenizer.eos_id,))
        [done] = batcher.run([Request(ids, settings)])
        return done

    complete.engine = lambda slots: Engine(run.task.model.decoder, variables, slots)
    return complete, tokenizer, chat_template(tokenizer, None)


def _client(url: str, key: str | None = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url, api_key=key or "none", max_retries=0, timeout=60)


def _greedy(reference, text: str, max_tokens: int, stop=()):
    from pax_lm.decoding import SamplingSettings

    complete, tokenizer, _ = reference
    return complete([tokenizer.bos_id, *tokenizer.encode(text)],
                    SamplingSettings(max_tokens=max_tokens, stop=tuple(stop)))


def _streamed_text(chunks, chat: bool) -> tuple[str, str | None, object]:
    text, reason, usage = "", None, None
    for chunk in chunks:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += (choice.delta.content or "") if chat else choice.text
            reason = choice.finish_reason or reason
    return text, reason, usage


def test_completions_and_chat_answer_as_the_engine_does_streamed_or_not(server, job, reference):
    _, url, _ = server
    client = _client(url)
    assert [m.id for m in client.models.list()] == [job.name]

    for prompt, max_tokens in (("And God said", 24), ("In the beginning", 9)):
        want = _greedy(reference, prompt, max_tokens)
        got = client.completions.create(model=job.name, prompt=prompt, max_tokens=max_tokens,
                                        temperature=0)
        assert got.choices[0].text == want.text
        assert got.choices[0].finish_reason == want.finish_reason == "length"
        assert got.usage.completion_tokens == max_tokens
        assert got.usage.prompt_tokens == 1 + len(prompt.encode())  # bos and bytes
        text, reason, usage = _streamed_text(client.completions.create(
            model=job.name, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}), chat=False)
        assert (text, reason) == (want.text, "length")
        assert usage.completion_tokens == max_tokens

    # A stop string: the text ends before it, streamed or not, and nothing of it is streamed.
    # The stop string: two characters first written after the continuation's start.
    prompt, stop = next((p, full[i:i + 2]) for p in PROMPTS
                        for full in [_greedy(reference, p, 40).text] for i in range(3, 30)
                        if full.find(full[i:i + 2]) == i)
    want = _greedy(reference, prompt, 40, stop=[stop])
    assert want.finish_reason == "stop" and stop not in want.text and len(want.text) >= 3
    got = client.completions.create(model=job.name, prompt=prompt, max_tokens=40,
                                    temperature=0, stop=stop)
    assert (got.choices[0].text, got.choices[0].finish_reason) == (want.text, "stop")
    text, reason, _ = _streamed_text(client.completions.create(
        model=job.name, prompt=prompt, max_tokens=40, temperature=0, stop=[stop],
        stream=True), chat=False)
    assert (text, reason) == (want.text, "stop")

    # Chat: the conversation through the chat template, then the same decoding.
    from pax_lm.decoding import SamplingSettings
    from pax_lm.sft.conversations import Conversation

    complete, tokenizer, template = reference
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Who spoke?"}]
    ids = template.prompt(Conversation(tuple(messages), "test"), tokenizer)
    want = complete(ids, SamplingSettings(max_tokens=12))
    got = client.chat.completions.create(model=job.name, messages=messages, max_tokens=12,
                                         temperature=0)
    assert got.choices[0].message.content == want.text
    assert got.choices[0].message.role == "assistant"
    assert got.usage.prompt_tokens == len(ids)
    text, reason, _ = _streamed_text(client.chat.completions.create(
        model=job.name, messages=messages, max_tokens=12, temperature=0, stream=True), chat=True)
    assert (text, reason) == (want.text, want.finish_reason)


def test_concurrent_clients_each_get_what_they_get_alone(server, job, reference):
    _, url, _ = server
    lengths = [5 + 3 * i for i in range(len(PROMPTS))]
    want = [_greedy(reference, p, n).text for p, n in zip(PROMPTS, lengths, strict=True)]

    def ask(i: int) -> tuple[str, str]:
        client = _client(url)
        greedy = client.completions.create(model=job.name, prompt=PROMPTS[i],
                                           max_tokens=lengths[i], temperature=0)
        sampled = client.completions.create(model=job.name, prompt=PROMPTS[i], max_tokens=10,
                                            temperature=1.0, seed=i, extra_body={"top_k": 20})
        return greedy.choices[0].text, sampled.choices[0].text

    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # 8 clients, 4 slots: some wait their turn
        together = list(pool.map(ask, range(len(PROMPTS))))
    assert [g for g, _ in together] == want
    alone = [ask(i)[1] for i in range(2)]  # a seed draws the same tokens whatever runs beside
    assert [s for _, s in together[:2]] == alone
    assert len(set(want)) > 3


def test_bad_requests_get_a_4xx_naming_the_problem_and_the_server_goes_on(server, job):
    import httpx2

    _, url, _ = server
    client = _client(url)
    cases = [
        (openai.BadRequestError, "must be at most 95 tokens",
         dict(prompt="x" * 200, max_tokens=4)),
        (openai.BadRequestError, "max_tokens must be >= 1, got -3",
         dict(prompt="x", max_tokens=-3)),
        (openai.BadRequestError, "max_tokens must be at most 95 on this server",
         dict(prompt="x", max_tokens=10**9)),
        (openai.BadRequestError, "temperature must be >= 0", dict(prompt="x", temperature=-1)),
        (openai.NotFoundError, "'nope' is not served here", dict(model="nope", prompt="x")),
    ]
    for error, message, arguments in cases:
        with pytest.raises(error, match=message):
            client.completions.create(**{"model": job.name, **arguments})
    with pytest.raises(openai.BadRequestError, match="role 'tool'; use one of"):
        client.chat.completions.create(model=job.name, messages=[{"role": "tool",
                                                                  "content": "x"}])
    with pytest.raises(openai.AuthenticationError, match="valid API key is required"):
        _client(url, key="wrong").models.list()
    raw = httpx2.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    for body, message in (("{not json", "the request body is not valid JSON"),
                          (json.dumps({"model": job.name, "prompt": "x", "frobnicate": 1}),
                           "unknown field 'frobnicate'"),
                          (json.dumps({"model": job.name, "prompt": 7}), "prompt: "),
                          (json.dumps({"prompt": "x"}), "model is required")):
        response = raw.post("/completions", content=body,
                            headers={"Content-Type": "application/json"})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["message"].startswith(message)
    assert httpx2.get(url.removesuffix("/v1") + "/health").json()["status"] == "ok"
    got = client.completions.create(model=job.name, prompt="And", max_tokens=3, temperature=0)
    assert got.usage.completion_tokens == 3


def test_the_service_bounds_its_queue_and_frees_a_cancelled_requests_slot(reference):
    import asyncio

    from pax_lm.decoding import SamplingSettings
    from pax_lm.inference import Batcher, Request
    from pax_lm.serving import Busy, DecodeService, ShuttingDown
    from pax_lm.serving.service import Delta, Done

    complete, tokenizer, _ = reference
    engine = complete.engine(1)
    service = DecodeService(Batcher(engine, tokenizer.decode), max_waiting=1)
    ids = [tokenizer.bos_id, *tokenizer.encode("And God said")]

    async def scenario() -> None:
        long = service.submit(Request(ids, SamplingSettings(max_tokens=80)), stream=True)
        waiting = service.submit(Request(ids, SamplingSettings(max_tokens=3)))
        with pytest.raises(Busy, match="1 requests are decoding and 1 waiting"):
            service.submit(Request(ids, SamplingSettings(max_tokens=3)))
        assert isinstance(await long.next(), Delta)
        long.cancel()
        events = []
        while not events or not isinstance(events[-1], Done):
            events.append(await long.next())
        assert isinstance(events[-1].error, ConnectionAbortedError)  # not run to its end
        assert sum(len(e.text) for e in events[:-1]) < 40
        assert len((await waiting.completion()).tokens) == 3  # it had the slot next
        assert service.in_flight == 0 and engine.free_slots == 1
        service.drain()
        with pytest.raises(ShuttingDown):
            service.submit(Request(ids))

    asyncio.run(scenario())
    service.close(10)


def _rss_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(line for line in status if line.startswith("VmRSS")).split()[1]) / 1024


def test_a_load_beyond_the_queue_gets_429s_and_loses_nothing(server, job, reference):
    process, url, _ = server
    want = {p: _greedy(reference, p, 20).text for p in PROMPTS}
    sent = 4 * (SLOTS + MAX_WAITING)

    def load() -> tuple[int, int]:
        def ask(i: int) -> str:
            prompt = PROMPTS[i % len(PROMPTS)]
            try:
                got = _client(url).completions.create(model=job.name, prompt=prompt,
                                                      max_tokens=20, temperature=0)
            except openai.RateLimitError as e:
                assert "the server is busy" in e.message
                return "busy"
            assert got.choices[0].text == want[prompt]
            return "ok"

        start = time.monotonic()
        with ThreadPoolExecutor(sent) as pool:
            outcomes = list(pool.map(ask, range(sent)))
        assert time.monotonic() - start < 60
        assert len(outcomes) == sent
        return outcomes.count("ok"), outcomes.count("busy")

    load()  # the server's memory settles
    before = _rss_mib(process.pid)
    for _ in range(3):
        ok, busy = load()
        assert ok >= SLOTS + MAX_WAITING and busy > 0 and ok + busy == sent
    assert _rss_mib(process.pid) - before < 40
    assert _client(url).completions.create(model=job.name, prompt="And", max_tokens=2,
                                           temperature=0).usage.completion_tokens == 2


def test_sigterm_finishes_the_requests_in_flight_and_refuses_new_ones(server, job, reference):
    """Stops the module's server: the last test."""
    process, url, errors = server
    max_tokens = MAX_SEQ_LEN - 1 - 13  # to the model's end after "And God said" and bos
    want = _greedy(reference, "And God said", max_tokens)
    results: dict[int, tuple[str, str | None]] = {}
    accepted = threading.Barrier(SLOTS + 3)  # every stream's response begun, and this thread

    def stream(i: int) -> None:
        chunks = _client(url).completions.create(model=job.name, prompt="And God said",
                                                 max_tokens=max_tokens, temperature=0,
                                                 stream=True)
        accepted.wait(60)
        text, reason = "", None
        for chunk in chunks:
            text += chunk.choices[0].text if chunk.choices else ""
            reason = chunk.choices[0].finish_reason if chunk.choices else reason
        results[i] = (text, reason)

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(SLOTS + 2)]
    for thread in threads:
        thread.start()
    accepted.wait(60)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    with pytest.raises((openai.APIConnectionError, openai.InternalServerError)):
        _client(url).completions.create(model=job.name, prompt="And", max_tokens=2)
    for thread in threads:
        thread.join(60)
    assert process.wait(60) == 128 + signal.SIGTERM  # pax: stopped on request
    stderr = errors.read_text()
    in_flight = int(stderr.split("stopping: ")[1].split()[0])
    assert in_flight >= 2, stderr  # the signal came while requests were decoding or waiting
    assert results == {i: (want.text, "length") for i in range(SLOTS + 2)}
    assert "Traceback" not in stderr
