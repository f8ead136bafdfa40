"""Input throughput: ``pax data prepare`` on a ~100 MB corpus, and the token input (grain,
packing on) next to what training consumes.

The corpus is the default corpus (the King James Bible, one document a chapter) copied until it
holds about 100 MB of JSON lines. Preparation is timed with the byte tokenizer and with a
SentencePiece model of 8,000 pieces trained on the corpus, with one worker process per core. The
input is timed at the training shape of each model (its sequence length and global batch, all on
one process), with 0, 1 and 2 worker processes, after a warm-up; training consumption is the
tokens/s `pax train` logs for the same model (``train_speed.run_pax``). Results in
bench/results/input_speed.{json,md}.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from models import BenchLm50M
from report import save
from train_speed import MODELS, run_pax

from pax_lm.corpus import default_corpus
from pax_lm.experiments.quickstart import QuickStartLm
from pax_lm.inputs.tokens import TokensInput
from pax_lm.preparation import prepare
from pax_lm.tokenizers import train_sentencepiece

TARGET_MB = 100
SEQ_LEN = {"quickstart": lambda: QuickStartLm.MAX_SEQ_LEN, "lm50m": lambda: BenchLm50M.MAX_SEQ_LEN}
BATCHES = 200


def write_corpus(path: Path) -> int:
    chapters = default_corpus()
    size, copy = 0, 0
    with open(path, "w") as f:
        while size < TARGET_MB << 20:
            for chapter in chapters:
                line = json.dumps({"text": f"[{copy}] {chapter}"}) + "\n"
                f.write(line)
                size += len(line)
            copy += 1
    return path.stat().st_size


def time_prepare(corpus: Path, output: Path, tokenizer: str) -> dict:
    started = time.perf_counter()
    metadata = prepare(corpus, output, tokenizer=tokenizer, workers=os.cpu_count())
    seconds = time.perf_counter() - started
    return {"tokenizer": Path(tokenizer).name, "seconds": seconds,
            "documents_per_sec": metadata["documents"] / seconds,
            "tokens_per_sec": metadata["tokens"] / seconds,
            "mb_per_sec": corpus.stat().st_size / 2**20 / seconds}


def time_input(path: Path, seq_len: int, batch_size: int, workers: int) -> float:
    data = TokensInput(path=str(path), seq_len=seq_len, batch_size=batch_size,
                       num_workers=workers)
    data.shard(0, 1)
    try:
        for _ in range(10):
            data.get_next()
        started, tokens = time.perf_counter(), 0.0
        for _ in range(BATCHES):
            tokens += data.get_next()["weights"].sum()
        return float(tokens) / (time.perf_counter() - started)
    finally:
        data.set_state(data.initial_state())  # stops the workers


def main() -> None:
    results: dict = {"prepare": [], "input": []}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpus = root / "corpus.jsonl"
        results["corpus_mb"] = write_corpus(corpus) / 2**20
        model = train_sentencepiece(default_corpus(), root / "spm", vocab_size=8000)
        for name, tokenizer in (("bytes", "bytes"), ("spm", model)):
            results["prepare"].append(time_prepare(corpus, root / name, tokenizer))
            print(results["prepare"][-1], flush=True)
        for key in ("quickstart", "lm50m"):
            trained = run_pax(MODELS[key], root, 0)
            consumed = float(np.median(trained["interval_tokens_per_sec"]))
            records = [json.loads(x) for x in (root / "pax-0" / "metrics.jsonl").open()]
            start = next(r for r in records if r["kind"] == "start")
            seq_len, batch = SEQ_LEN[key](), start["global_batch_size"]
            for workers in (0, 1, 2):
                supplied = time_input(root / "bytes", seq_len, batch, workers)
                results["input"].append({"model": MODELS[key].name, "seq_len": seq_len,
                                         "batch": batch, "workers": workers,
                                         "input_tokens_per_sec": supplied,
                                         "train_tokens_per_sec": consumed,
                                         "ratio": supplied / consumed})
                print(results["input"][-1], flush=True)
            shutil.rmtree(root / "pax-0")
    lines = [f"`pax data prepare` on {results['corpus_mb']:.0f} MB of JSON lines, "
             f"{os.cpu_count()} workers", "",
             "| tokenizer | seconds | documents/s | tokens/s | MB/s |", "|---|---|---|---|---|"]
    lines += [f"| {p['tokenizer']} | {p['seconds']:.1f} | {p['documents_per_sec']:,.0f} | "
              f"{p['tokens_per_sec']:,.0f} | {p['mb_per_sec']:.1f} |" for p in results["prepare"]]
    lines += ["", "Token input (packing on) against `pax train`'s consumption", "",
              "| model | seq_len x batch | workers | input tokens/s | training tokens/s | "
              "input / training |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['model']} | {r['seq_len']} x {r['batch']} | {r['workers']} | "
              f"{r['input_tokens_per_sec']:,.0f} | {r['train_tokens_per_sec']:,.0f} | "
              f"{r['ratio']:.1f}x |" for r in results["input"]]
    save("input_speed", results, "\n".join(lines))


if __name__ == "__main__":
    main()
