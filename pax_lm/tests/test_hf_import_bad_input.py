"""``pax import hf`` refuses what it cannot import in one line, exit 2, writing nothing: a
missing config.json, an unsupported architecture or setting, weights that do not fit their
configuration, a truncated safetensors file, a tokenizer larger than the embedding, an output
folder that is not empty. The folders are written here with safetensors and tokenizers alone
(transformers is not needed to make a Llama folder)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from pax_core import UsageError
from pax_core.testing import import_job, isolated_host, run_pax

CONFIG = {"model_type": "llama", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 24,
          "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
          "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "tie_word_embeddings": True,
          "hidden_act": "silu", "torch_dtype": "float32"}


def _tensors(config: dict) -> dict[str, np.ndarray]:
    d, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    p = "model.layers.0"
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,),
              f"{p}.input_layernorm.weight": (d,), f"{p}.post_attention_layernorm.weight": (d,),
              f"{p}.self_attn.q_proj.weight": (d, d), f"{p}.self_attn.k_proj.weight": (d, d),
              f"{p}.self_attn.v_proj.weight": (d, d), f"{p}.self_attn.o_proj.weight": (d, d),
              f"{p}.mlp.gate_proj.weight": (f, d), f"{p}.mlp.up_proj.weight": (f, d),
              f"{p}.mlp.down_proj.weight": (d, f)}
    rng = np.random.default_rng(0)
    return {name: rng.normal(size=shape).astype(np.float32) for name, shape in shapes.items()}


def _tokenizer(folder: Path, size: int) -> None:
    import tokenizers

    words = ["<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(size - 3)]
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    tokenizer.save(str(folder / "tokenizer.json"))


def _folder(root: Path, config: dict | None = None, tensors: dict | None = None,
            vocabulary: int = 20) -> Path:
    folder = root / "hf"
    folder.mkdir()
    config = CONFIG if config is None else config
    (folder / "config.json").write_text(json.dumps(config))
    save_file(_tensors(CONFIG) if tensors is None else tensors, str(folder / "model.safetensors"))
    _tokenizer(folder, vocabulary)
    return folder


@pytest.fixture(scope="module")
def host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")))


def _refused(host, source: Path, output: Path, *expected: str) -> None:
    with pytest.raises(UsageError) as raised:
        import_job(host, format_name="hf", source=str(source), output=str(output))
    message = str(raised.value)
    assert "\n" not in message
    for part in expected:
        assert part in message, message
    assert not output.exists() and not output.with_name(output.name + ".partial").exists()


def test_a_good_folder_imports(host, tmp_path):
    """The folder the refusals below start from is itself good: it imports."""
    record = import_job(host, format_name="hf", source=str(_folder(tmp_path)),
                        output=str(tmp_path / "job"))
    assert record["experiment"] == "OpenWeightsLm"
    assert (tmp_path / "job" / "assets" / "tokenizer.json").exists()
    assert (tmp_path / "job" / "checkpoints" / "0").is_dir()


def test_a_folder_without_config_json(host, tmp_path):
    source = _folder(tmp_path)
    (source / "config.json").unlink()
    _refused(host, source, tmp_path / "job", "has no config.json")


@pytest.mark.parametrize(("change", "named"), [
    ({"model_type": "mamba"}, "model_type 'mamba' is not supported"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling 'yarn'"),
    ({"hidden_act": "swiglu_unknown"}, "activation hidden_act='swiglu_unknown'"),
    ({"mlp_bias": True}, "mlp_bias"),
])
def test_an_unsupported_architecture_or_setting(host, tmp_path, change, named):
    _refused(host, _folder(tmp_path, {**CONFIG, **change}), tmp_path / "job", named)


def test_a_shape_that_does_not_match_the_config(host, tmp_path):
    tensors = _tensors(CONFIG)
    tensors["model.layers.0.mlp.up_proj.weight"] = np.zeros((20, 16), np.float32)
    _refused(host, _folder(tmp_path, tensors=tensors), tmp_path / "job",
             "model.layers.0.mlp.up_proj.weight is (20, 16) in the weights and (24, 16)")


def test_a_missing_or_extra_tensor(host, tmp_path):
    tensors = _tensors(CONFIG)
    del tensors["model.norm.weight"]
    _refused(host, _folder(tmp_path, tensors=tensors), tmp_path / "job", "lack model.norm.weight")
    extra = _tensors(CONFIG)
    extra["model.layers.1.input_layernorm.weight"] = np.ones(16, np.float32)
    other = tmp_path / "other"
    other.mkdir()
    _refused(host, _folder(other, tensors=extra), tmp_path / "job",
             "hold model.layers.1.input_layernorm.weight")


def test_a_truncated_safetensors_file(host, tmp_path):
    source = _folder(tmp_path)
    weights = source / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    _refused(host, source, tmp_path / "job", "is truncated", "download it again")


def test_a_tokenizer_larger_than_the_embedding(host, tmp_path):
    _refused(host, _folder(tmp_path, vocabulary=40), tmp_path / "job",
             "has 40 tokens and the model's embedding 32 rows")


def test_an_output_that_is_not_empty_is_left_alone(tmp_path):
    source = _folder(tmp_path)
    job = tmp_path / "job"
    job.mkdir()
    (job / "notes.txt").write_text("mine")
    result = run_pax("import", "hf", str(source), "--output", str(job))
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "exists and is not empty" in result.stderr
    assert sorted(p.name for p in job.iterdir()) == ["notes.txt"]


def test_peft_folders_are_not_imported(tmp_path):
    """PEFT's format is written by ``pax export`` only (its folders hold no base model)."""
    source = _folder(tmp_path)
    result = run_pax("import", "peft", str(source), "--output", str(tmp_path / "job"))
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "pax import does not read it" in result.stderr
    assert not (tmp_path / "job").exists()
