"""``pax serve`` under load: the same requests sent by 8 concurrent clients against one client
sending them one after another, tokens per second and each request's latency.

The model is ``QuickStartLm`` trained by ``pax train`` in a fresh process (``--steps``, 100 by
default: speed does not depend on how well it writes). ``pax serve`` then serves it with 8 slots
on 127.0.0.1, and OpenAI's Python client sends every request: ``--requests`` prompts (verse
openings), ``--max-tokens`` new tokens each at temperature 0.8 with a seed per request, so the
two ways of sending draw the same tokens. A round sends them all sequentially (one client,
each request after the previous one's answer) and then concurrently (8 client threads taking
the next request as each finishes); ``--rounds`` rounds, after one unmeasured round that warms
both paths. Tokens per second is the completion tokens the server reports (``usage``) over the
wall time; a request's latency is from its send to its whole answer. The figures are each
way's median over the rounds, and the ratio the median of the rounds' ratios.

    python bench/serve_speed.py [--steps N] [--requests N] [--max-tokens N] [--rounds N]

Writes bench/results/serve_speed.{json,md}. Needs pax-lm's ``serve`` and ``test`` extras
(FastAPI, uvicorn, openai).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import report
from quantization import train

CLIENTS = 8
OPENINGS = ["In the beginning", "And God said", "And the earth", "Let there be", "And it came",
            "Then the LORD", "And he said", "Blessed is", "For the", "And the men"]


def serve(job: Path, slots: int) -> tuple[subprocess.Popen, str]:
    """A ``pax serve`` process over ``job`` and its base URL, once it listens."""
    command = [str(Path(sys.executable).with_name("pax")), "serve", "--job-dir", str(job),
               "--port", "0", "--slots", str(slots), "--max-waiting", "1000"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    if "serving" not in line:
        process.kill()
        raise SystemExit(f"pax serve did not start: {line}")
    return process, line.split(" at ")[1].split()[0]


def send(url: str, prompts: list[str], max_tokens: int, clients: int) -> dict[str, Any]:
    """Every prompt through ``clients`` threads; tokens/s and latencies."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)

    def one(i: int) -> tuple[int, float, str]:
        started = time.perf_counter()
        got = client.completions.create(model="job", prompt=prompts[i], max_tokens=max_tokens,
                                        temperature=0.8, seed=i)
        return got.usage.completion_tokens, time.perf_counter() - started, got.choices[0].text

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(one, range(len(prompts))))
    seconds = time.perf_counter() - started
    tokens = sum(t for t, _, _ in answers)
    latencies = sorted(s for _, s, _ in answers)
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
            "p50_s": statistics.median(latencies),
            "p99_s": latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))],
            "texts": [text for _, _, text in answers]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="serve_speed_"))
    job = work / "job"
    trained = train(job, args.steps)
    prompts = [OPENINGS[i % len(OPENINGS)] for i in range(args.requests)]
    process, url = serve(job, CLIENTS)
    try:
        send(url, prompts, args.max_tokens, 1)  # warm-up: both paths, every bucket used
        send(url, prompts, args.max_tokens, CLIENTS)
        rounds = []
        for _ in range(args.rounds):
            one = send(url, prompts, args.max_tokens, 1)
            many = send(url, prompts, args.max_tokens, CLIENTS)
            if one["texts"] != many["texts"]:
                raise SystemExit("the concurrent answers differ from the sequential ones")
            rounds.append({"sequential": one, "concurrent": many})
    finally:
        process.terminate()
        process.wait(60)
    for r in rounds:
        for way in r.values():
            del way["texts"]

    def median(way: str, key: str) -> float:
        return statistics.median(r[way][key] for r in rounds)

    ratios = [r["concurrent"]["tokens_per_s"] / r["sequential"]["tokens_per_s"] for r in rounds]
    result = {"model": "QuickStartLm", "train": trained, "requests": args.requests,
              "max_tokens": args.max_tokens, "clients": CLIENTS, "slots": CLIENTS,
              "rounds": rounds, "ratio": statistics.median(ratios),
              **{f"{way}_{key}": median(way, key) for way in ("sequential", "concurrent")
                 for key in ("tokens_per_s", "p50_s", "p99_s")}}
    rows = [f"| {way} | {result[f'{way}_tokens_per_s']:,.0f} | "
            f"{result[f'{way}_p50_s'] * 1000:,.0f} | {result[f'{way}_p99_s'] * 1000:,.0f} |"
            for way in ("sequential", "concurrent")]
    table = "\n".join([
        f"# `pax serve`: {CLIENTS} concurrent clients against one", "",
        f"{args.requests} completions of up to {args.max_tokens} tokens (temperature 0.8, a "
        f"seed each) from `QuickStartLm` served with {CLIENTS} slots; medians of "
        f"{args.rounds} rounds.", "",
        "| clients | tokens/s | p50 latency (ms) | p99 latency (ms) |",
        "| --- | ---: | ---: | ---: |", *rows, "",
        f"Concurrent against sequential: **{result['ratio']:.2f}x** the tokens per second "
        f"(the rounds: {', '.join(f'{r:.2f}x' for r in ratios)}); the answers are the same "
        f"either way."])
    report.save("serve_speed", result, table)


if __name__ == "__main__":
    main()
