"""Hugging Face folders in and out, against transformers itself: for every open family (Mixtral's
sparse layers among them), a tiny random model that transformers builds and saves is imported
(``pax import hf``) and must give the same logits (float32 round-off) and the same greedy
tokens; exported back (``pax export --format hf``) it must load in ``from_pretrained`` with no
missing or unexpected keys and the very same weights; imported again, the job's weights must be
bitwise those it was exported from."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import jax
import numpy as np
import pytest
import torch
import transformers
from hf_models import CONFIGS, save_family

from pax_core import restore_latest
from pax_core.testing import export_params, import_job, isolated_host, read_params, run_pax

IDS = np.array([[1, 5, 9, 13, 17, 40, 41, 42, 7, 3, 60, 61, 2, 8, 30, 31, 33, 20, 21, 22]])
GREEDY = 20


@pytest.fixture(scope="module")
def host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")))


def _pax(host, job: Path, *set_items: str):
    run, state, step = restore_latest(host, exp=None, plugin=None, set_items=list(set_items),
                                      job_dir=str(job))
    return run.task.model.decoder, jax.device_get(state.params["decoder"]), step


def _greedy_torch(model, ids: np.ndarray, steps: int) -> list[int]:
    tokens = torch.tensor(ids)
    with torch.no_grad():
        for _ in range(steps):
            nxt = model(tokens).logits[:, -1].argmax(-1, keepdim=True)
            tokens = torch.cat([tokens, nxt], dim=1)
    return tokens[0, ids.shape[1]:].tolist()


def _greedy_pax(decoder, params, ids: np.ndarray, steps: int) -> list[int]:
    """Greedy tokens from one compiled forward pass over a buffer of the final length: the
    decoder is causal (and Mixtral's routing dropless), so the zeros after position ``n`` leave
    its logits as they are, and each step reads the position it fills."""
    apply = jax.jit(lambda p, t, n: decoder.apply({"params": p}, t)[0, n - 1].argmax())
    tokens = np.zeros((1, ids.shape[1] + steps), ids.dtype)
    tokens[:, :ids.shape[1]] = ids
    for n in range(ids.shape[1], tokens.shape[1]):
        tokens[0, n] = apply(params, tokens, n)
    return tokens[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_a_family_imports_and_exports_exactly(family, host, tmp_path):
    source = tmp_path / "hf"
    model = save_family(family, source)
    job = tmp_path / "job"
    record = import_job(host, format_name="hf", source=str(source), output=str(job))
    assert record["num_params"] == sum(p.numel() for n, p in model.named_parameters()
                                       if not n.endswith("lm_head.weight")
                                       or not model.config.tie_word_embeddings)
    decoder, params, step = _pax(host, job)
    assert step == 0
    with torch.no_grad():
        expected = model(torch.tensor(IDS)).logits.numpy()
    logits = np.asarray(jax.jit(decoder.apply)({"params": params}, IDS))
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)
    assert _greedy_pax(decoder, params, IDS, GREEDY) == _greedy_torch(model, IDS, GREEDY)

    out = tmp_path / "exported"
    export_params(host, job_dir=str(job), output=str(out), format_name="hf")
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert type(loaded) is type(model)
    original = model.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, original[name]), name

    again = tmp_path / "again"
    import_job(host, format_name="hf", source=str(out), output=str(again))
    first, second = read_params(job), read_params(again)
    assert first.keys() == second.keys()
    for key, value in first.items():
        np.testing.assert_array_equal(second[key], value, err_msg=key)


def test_a_bfloat16_checkpoint_imports_and_exports_exactly_and_runs_in_bfloat16(host, tmp_path):
    """A checkpoint saved in bfloat16 (as most are published) is imported exactly (its weights
    widened to float32 without change), its job computes in bfloat16, within bfloat16's
    precision of transformers' float32 forward pass over the same weights, and its export is
    bfloat16 again, the very same values."""
    source = tmp_path / "hf"
    model = save_family("llama", source, dtype=torch.bfloat16)
    rounded = model.to(torch.bfloat16).to(torch.float32)  # the weights as saved
    job = tmp_path / "job"
    import_job(host, format_name="hf", source=str(source), output=str(job))
    decoder, params, _ = _pax(host, job)
    assert decoder.dtype == "bfloat16"
    embedding = rounded.model.embed_tokens.weight.detach().numpy()
    np.testing.assert_array_equal(params["embedding"]["embedding"], embedding)
    with torch.no_grad():
        expected = rounded(torch.tensor(IDS)).logits.numpy()
    logits = np.asarray(jax.jit(decoder.apply)({"params": params}, IDS))
    scale = np.abs(expected).max()
    error = np.abs(logits - expected).max()
    assert error < 0.03 * scale, (error, scale)
    assert (logits.argmax(-1) == expected.argmax(-1)).mean() >= 0.9
    out = tmp_path / "exported"
    export_params(host, job_dir=str(job), output=str(out), format_name="hf")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert loaded.dtype == torch.bfloat16  # handed on as it came
    saved = rounded.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor.float(), saved[name]), name


def test_the_commands_of_the_readme_work_as_written(tmp_path):
    """``pax import hf``, ``pax decode``, ``pax train`` (no --exp: the job's own) and ``pax
    export --format hf`` from the command line, on a Qwen 2 folder, with text of the model's
    own tokens to continue training on."""
    source = tmp_path / "qwen"
    model = save_family("qwen2", source)
    job, out = tmp_path / "job", tmp_path / "tuned"
    result = run_pax("import", "hf", str(source), "--output", str(job))
    assert result.returncode == 0, result.stderr
    assert "imported Qwen 2 (qwen)" in result.stdout

    prompt = "w3 w4 w5"
    result = run_pax("decode", "--job-dir", str(job), "--prompt", prompt,
                     "--max-decode-steps", "8")
    assert result.returncode == 0, result.stderr
    ids = [1, 6, 7, 8]  # <s> and the prompt's words
    expected = _greedy_torch(model, np.array([ids]), 8)
    words = [f"w{i - 3}" if i >= 3 else ["<pad>", "<s>", "</s>"][i] for i in expected]
    shown = f"[step 0] {prompt}"  # the imported weights are the job's step 0
    assert result.stdout.startswith(shown), result.stdout
    generated = result.stdout[len(shown):].split()
    assert generated == [w for w in words if w not in ("<pad>", "<s>", "</s>")]

    text = tmp_path / "notes.jsonl"
    text.write_text("".join(json.dumps({"text": " ".join(f"w{(i * 7 + j) % 80}"
                                                          for j in range(40))}) + "\n"
                            for i in range(2000)))
    result = run_pax("train", "--job-dir", str(job), "--set", f"CORPUS_PATH='{text}'",
                     "--set", "NUM_TRAIN_STEPS=2", "--set", "MAX_SEQ_LEN=32", timeout=600)
    assert result.returncode == 0, result.stderr
    result = run_pax("export", "--job-dir", str(job), "--format", "hf", "--output", str(out))
    assert result.returncode == 0, result.stderr
    tuned = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert type(tuned) is type(model)
    assert (out / "tokenizer.json").exists()


@pytest.mark.parametrize("family", ["gemma3", "mixtral"])
def test_a_scanned_stack_imports_and_exports_the_same_model(family, host, tmp_path):
    """With the layers scanned (each weight of all layers in one array, as the named
    experiments run them; Mixtral's experts then [layers, experts, ...]), the same logits come
    out, and the export is the same folder."""
    source = tmp_path / "hf"
    model = save_family(family, source)
    job = tmp_path / "job"
    import_job(host, format_name="hf", source=str(source), output=str(job),
               set_items=["USE_REPEATED_LAYER=True"])
    decoder, params, _ = _pax(host, job)
    assert decoder.scan_layers and "layers" in params["stack"]
    with torch.no_grad():
        expected = model(torch.tensor(IDS)).logits.numpy()
    logits = np.asarray(jax.jit(decoder.apply)({"params": params}, IDS))
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=0)
    out = tmp_path / "exported"
    export_params(host, job_dir=str(job), output=str(out), format_name="hf")
    loaded, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, output_loading_info=True, dtype=torch.float32)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    original = model.state_dict()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, original[name]), name


def test_mixtrals_routing_comes_in_and_other_routing_is_not_exported_as_it(host, tmp_path):
    """An imported Mixtral's job routes as Mixtral does (2 of 4 experts, dropless, the weights
    renormalised, Hugging Face's auxiliary-loss coefficient as Pax's weight); asked to route
    otherwise (a capacity, weights not renormalised), it is not written as Mixtral: one line,
    exit 2, naming both, and no folder."""
    source, job = tmp_path / "hf", tmp_path / "job"
    save_family("mixtral", source)
    result = run_pax("import", "hf", str(source), "--output", str(job))
    assert result.returncode == 0, result.stderr
    assert "imported Mixtral (hf)" in result.stdout
    decoder, _, _ = _pax(host, job)
    experts = decoder.block_config().feed_forward_part()
    assert (experts.num_experts, experts.top_k, experts.capacity_factor, experts.normalize_top_k,
            experts.shared_experts, experts.hidden_dims) == (4, 2, None, True, 0, 112)
    assert experts.load_balancing_weight == pytest.approx(0.04)  # 0.02 x top_k: Pax's loss
    out = tmp_path / "exported"
    result = run_pax("export", "--job-dir", str(job), "--format", "hf", "--output", str(out),
                     "--set", "EXPERT_CAPACITY_FACTOR=1.25",
                     "--set", "NORMALIZE_EXPERT_WEIGHTS=False")
    assert result.returncode == 2, result.stderr
    assert result.stderr == (
        "pax: error: this model's Mixture-of-Experts settings are not Mixtral's: "
        "EXPERT_CAPACITY_FACTOR=1.25 (Mixtral: None), NORMALIZE_EXPERT_WEIGHTS=False "
        "(Mixtral: True); it exports as Pax's own format (pax export without --format)\n")
    assert not out.exists()
    config = json.loads((source / "config.json").read_text())
    assert config["router_aux_loss_coef"] == 0.02
    export_params(host, job_dir=str(job), output=str(out), format_name="hf")
    written = json.loads((out / "config.json").read_text())
    assert {key: written[key] for key in ("num_local_experts", "num_experts_per_tok",
                                          "intermediate_size", "router_aux_loss_coef")} == {
        "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 112,
        "router_aux_loss_coef": 0.02}
