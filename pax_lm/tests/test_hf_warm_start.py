"""A model trained in Pax, handed on as a Hugging Face folder (``pax export --format hf``),
and taken up again by a new job (``pax train --init-from FOLDER``) starts at the loss it was
trained to, not at the loss of a fresh model (log 259 over bytes): the whole way out and back
in, without transformers."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pax_core.testing import read_metrics, run_pax

pytestmark = pytest.mark.slow

# A tiny Llama over bytes (the exported folder then has no tokenizer file to carry).
LLAMA = ["NUM_LAYERS=2", "MODEL_DIMS=64", "HIDDEN_DIMS=128", "NUM_HEADS=4", "DIMS_PER_HEAD=16",
         "NUM_KV_HEADS=2", "VOCAB_SIZE=259", "MAX_SEQ_LEN=64", "FPROP_DTYPE='float32'",
         "SEPARATE_EMBEDDING=True", "NORMALIZATION='rmsnorm'", "ACTIVATION='silu'",
         "USE_GATED_ACTIVATION=True", "USE_ROTARY_POSITION_EMB=True", "SCALE_EMBEDDING=False",
         "SUMMARY_INTERVAL_STEPS=1", "EVAL_INTERVAL_STEPS=1000"]
TRAIN = ["LEARNING_RATE=3e-3", "LR_COS_WARMUP=5", "LR_COS_DECAY_START=5",
         "LR_COS_DECAY_END=80", "NUM_TRAIN_STEPS=80", "CHECKPOINT_EVERY_N_STEPS=80"]


def _train(job: Path, *settings: str, extra: tuple[str, ...] = ()):
    sets = [arg for s in (*LLAMA, *settings) for arg in ("--set", s)]
    return run_pax("train", "--exp", "OpenWeightsLm", "--job-dir", str(job), *sets, *extra,
                   timeout=600)


def _losses(job: Path) -> list[float]:
    return [r["loss"] for r in read_metrics(job) if r.get("kind") == "train"]


def test_a_new_job_from_an_exported_folder_starts_where_training_ended(tmp_path):
    trained = tmp_path / "trained"
    result = _train(trained, *TRAIN)
    assert result.returncode == 0, result.stderr
    first, last = _losses(trained)[0], _losses(trained)[-1]
    assert first > math.log(259) - 0.3 and last < first - 2.0, (first, last)

    folder = tmp_path / "hf"
    result = run_pax("export", "--job-dir", str(trained), "--format", "hf", "--output",
                     str(folder))
    assert result.returncode == 0, result.stderr
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_key_value_heads"] == 2

    taken_up = tmp_path / "taken_up"
    result = _train(taken_up, "NUM_TRAIN_STEPS=1", "LEARNING_RATE=1e-6",
                    extra=("--init-from", str(folder)))
    assert result.returncode == 0, result.stderr
    (start,) = _losses(taken_up)
    assert abs(start - last) < 0.3, (start, last, first)
