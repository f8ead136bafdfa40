"""Low-rank adapters handed on, against transformers and peft themselves: a Llama imported
from a folder transformers saved, its adapters trained a few steps (``LORA_RANK``), then
exported twice: folded into the weights (``--format hf``), which ``from_pretrained`` loads, and
as PEFT's adapter folder (``--format peft``), which ``PeftModel.from_pretrained`` puts on the
original folder; both compute the job's logits (with its adapters unmerged)."""

from __future__ import annotations

import importlib
import json

import jax
import numpy as np
import peft
import pytest
import torch
import transformers
from hf_models import save_family

from pax_core import restore_latest
from pax_core.testing import isolated_host, run_pax

IDS = np.array([[1, 5, 9, 13, 17, 40, 41, 42, 7, 3, 60, 61, 2, 8, 30, 31]])
TARGETS = "('query','value','output','gate','down')"


@pytest.fixture(scope="module")
def adapted(tmp_path_factory):
    """The original folder and a job of it whose adapters trained three steps."""
    root = tmp_path_factory.mktemp("lora")
    source, job = root / "llama", root / "job"
    save_family("llama", source)
    assert run_pax("import", "hf", str(source), "--output", str(job)).returncode == 0
    text = root / "notes.jsonl"
    text.write_text("".join(json.dumps({"text": " ".join(f"w{(i * 7 + j) % 80}"
                                                          for j in range(40))}) + "\n"
                            for i in range(500)))
    result = run_pax("train", "--job-dir", str(job), "--set", f"CORPUS_PATH='{text}'",
                     "--set", "LORA_RANK=4", "--set", f"LORA_TARGETS={TARGETS}",
                     "--set", "NUM_TRAIN_STEPS=3", "--set", "MAX_SEQ_LEN=32",
                     "--set", "LEARNING_RATE=5e-2", "--set", "LR_COS_WARMUP=0", timeout=600)
    assert result.returncode == 0, result.stderr
    return source, job


def _job_logits(job) -> np.ndarray:
    host = isolated_host(("lm", importlib.import_module("pax_lm.plugin")))
    run, state, step = restore_latest(host, exp=None, plugin=None, set_items=[],
                                      job_dir=str(job))
    assert step == 3
    params = jax.device_get(state.params["decoder"])
    return np.asarray(jax.jit(run.task.model.decoder.apply)({"params": params}, IDS))


def _torch_logits(model) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(IDS)).logits.numpy()


def test_merged_adapters_load_in_transformers_and_compute_the_jobs_logits(adapted, tmp_path):
    source, job = adapted
    out = tmp_path / "merged"
    result = run_pax("export", "--job-dir", str(job), "--format", "hf", "--output", str(out))
    assert result.returncode == 0, result.stderr
    merged = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    base = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    logits = _job_logits(job)
    assert np.abs(_torch_logits(base) - logits).max() > 1e-2  # the adapters changed the model
    np.testing.assert_allclose(_torch_logits(merged), logits, atol=1e-4, rtol=0)


def test_peft_puts_the_exported_adapters_on_the_original_model(adapted, tmp_path):
    source, job = adapted
    out = tmp_path / "adapter"
    result = run_pax("export", "--job-dir", str(job), "--format", "peft", "--output", str(out))
    assert result.returncode == 0, result.stderr
    config = json.loads((out / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == ["down_proj", "gate_proj", "o_proj", "q_proj",
                                                "v_proj"]
    base = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base, out)
    model.eval()
    np.testing.assert_allclose(_torch_logits(model), _job_logits(job), atol=1e-4, rtol=0)


def test_a_job_without_adapters_is_not_written_as_peft(tmp_path):
    source, job = tmp_path / "llama", tmp_path / "job"
    save_family("llama", source)
    assert run_pax("import", "hf", str(source), "--output", str(job)).returncode == 0
    result = run_pax("export", "--job-dir", str(job), "--format", "peft",
                     "--output", str(tmp_path / "out"))
    assert result.returncode == 2 and "has no adapters" in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and not (tmp_path / "out").exists()
