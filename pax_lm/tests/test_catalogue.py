"""Every registered LM experiment builds, with the parameter count its sizes imply."""

from __future__ import annotations

import importlib
import math
import re

import fiddle as fdl
import jax
import jax.numpy as jnp
import pytest

from pax_core import UsageError
from pax_core.testing import isolated_host, resolve
from pax_lm.experiments.base import PipelinedExperiment
from pax_lm.experiments.catalogue import EXPERIMENTS

CATALOGUE = [e for e in EXPERIMENTS if e.target.startswith("pax_lm.experiments.")]
# The open models' weights as their model cards and checkpoints count them (Gemma 3 4B: its
# text decoder; the other 0.4B are its vision encoder).
PUBLISHED_PARAMS = {
    "Llama3_1_8B": 8_030_261_248, "Llama3_1_70B": 70_553_706_496,
    "Llama3_2_1B": 1_235_814_400, "Llama3_2_3B": 3_212_749_824, "Mistral7B": 7_241_732_096,
    "Qwen2_5_7B": 7_615_616_512, "Qwen3_8B": 8_190_735_360, "Gemma2_9B": 9_241_705_984,
    "Gemma3_4B": 3_880_263_168, "Mixtral8x7B": 46_702_792_704, "Mixtral8x22B": 140_630_071_296,
    # DeepSeekMoE 16B's from its config.json (its paper: 16.4B)
    "DeepSeekMoE16B": 16_375_728_128,
}


def expected_count(name: str, exp) -> int:
    """The published count of an open model, else the count Pax's layout implies."""
    return PUBLISHED_PARAMS.get(name) or expected_params(decoder_fields(exp))


@pytest.fixture(scope="module")
def host():
    return isolated_host(("lm", importlib.import_module("pax_lm.plugin")),
                         ("transformer", importlib.import_module("pax_transformer.plugin")),
                         ("pipeline", importlib.import_module("pax_pipeline.plugin")))


def expected_params(d) -> int:
    """The analytic count for a TransformerLm with the fields ``d`` (pre-norm, Pax layout),
    sparse layers (an MoeFeedForward's router, experts and shared experts, without biases)
    where its ``feed_forward`` and layer pattern place them."""
    model, hidden, vocab = d["model_dims"], d["hidden_dims"], d["vocab_size"]
    heads, per_head = d["num_heads"], d["dim_per_head"]
    kv_heads = d["num_kv_heads"] or heads
    norm = 2 * model if d["norm"] == "layernorm" else model
    ffn_in = 2 if d["gated"] else 1
    around = 2 * norm + model * heads * per_head + 2 * model * kv_heads * per_head \
        + heads * per_head * model
    ffn = ffn_in * model * hidden + hidden * model
    if d["use_bias"]:
        around += heads * per_head + 2 * kv_heads * per_head + model
        ffn += ffn_in * hidden + model
    sparse, layers = _sparse_ffn(d), d["num_layers"]
    first, every = d["first_dense_layers"], d["moe_every"]
    sparse_layers = 0 if sparse is None else sum(
        1 for i in range(layers) if i >= first and (i - first + 1) % every == 0)
    total = (vocab * model + layers * around + (layers - sparse_layers) * ffn
             + sparse_layers * (sparse or 0) + norm)
    if d["position"] == "learned":
        total += d["max_seq_len"] * model
    if not d["tied_embedding"]:
        total += model * vocab + (vocab if d["use_bias"] else 0)
    return total


def _sparse_ffn(d) -> int | None:
    """One MoE feed-forward's weights (None for a dense decoder)."""
    if d["feed_forward"] is None:
        return None
    m, model = fdl.ordered_arguments(d["feed_forward"]), d["model_dims"]
    hidden = m.get("hidden_dims", d["hidden_dims"])
    matrices = 3 if m.get("gated", d["gated"]) else 2
    experts = m["num_experts"] + m.get("shared_experts", 0)
    return model * m["num_experts"] + experts * matrices * model * hidden


def decoder_fields(exp) -> dict:
    return fdl.ordered_arguments(exp.decoder(), include_defaults=True)


@pytest.mark.parametrize("ref", CATALOGUE, ids=[e.name for e in CATALOGUE])
def test_experiment_builds_with_the_expected_parameter_count(host, ref):
    cls = host.components("experiments").get(ref.name).load()
    resolved = resolve(host, ref.name, "lm", [])
    assert resolved.config.task.train.num_train_steps > 0
    exp = cls()
    decoder = fdl.build(exp.decoder())
    # A pipelined decoder splits its batch into microbatches: give it a whole global batch.
    batch = exp.global_batch_size() if issubclass(cls, PipelinedExperiment) else 1
    shapes = jax.eval_shape(lambda: decoder.init(jax.random.PRNGKey(0),
                                                 jnp.zeros((batch, 8), jnp.int32)))
    counted = sum(math.prod(x.shape) for x in jax.tree.leaves(shapes))
    assert counted == expected_count(ref.name, exp)
    assert exp.global_batch_size() >= 1
    stated = re.search(r"([\d.]+)M-parameter", ref.help)  # what `pax experiments` says
    if stated:
        assert f"{counted / 1e6:.{len(stated[1].partition('.')[2])}f}" == stated[1], counted


@pytest.mark.parametrize("name", ["LmCloudSpmd2B", "LmCloudSpmd32B", "LmCloudSpmd128B",
                                  "LmCloudSpmd1024B", "C4Spmd1BAdam4Replicas",
                                  "C4Spmd16BAdam32Replicas"])
def test_sizes_match_the_names(host, name):
    exp = host.components("experiments").get(name).load()()
    billions = int(re.search(r"(\d+)B", name).group(1))
    assert expected_params(decoder_fields(exp)) / 1e9 == pytest.approx(billions, rel=0.15)


@pytest.mark.parametrize(
    ("name", "batch", "mesh"),
    [
        ("LmCloudSpmd2B", 32, [1, 4, 1]),
        ("LmCloudSpmdMultislice2B", 128, [1, 4, 1]),
        ("C4Spmd16BAdam32Replicas", 512, [1, 16, 2]),
        ("C4SpmdGpt3AdamDataParallel2x16x16", 256, [1, 16, 16]),
        ("LmCloudSpmdPipeline175B", 96, [1, 1, 1, 16]),
        ("C4SpmdPipelineGpt3SmallAdam8Replicas", 512, [2, 1, 2, 2]),
    ],
)
def test_global_batch_is_per_core_batch_times_devices(host, name, batch, mesh):
    exp = host.components("experiments").get(name).load()()
    assert exp.global_batch_size() == batch
    assert mesh == exp.ICI_MESH_SHAPE


def test_mlperf_schedule_follows_the_global_batch(host):
    exp = host.components("experiments").get(
        "C4SpmdPipelineGpt3AdamMLPerfHPBS4k1024Replicas").load()()
    optimizer = exp.task().train.learner.optimizer
    assert (optimizer.learning_rate, optimizer.lr_schedule.warmup_steps,
            optimizer.lr_schedule.decay_end) == (3e-5, 100, 40725)


def test_mlperf_constants_the_user_sets_are_kept(host):
    job = resolve(host, "C4SpmdPipelineGpt3AdamMLPerfHPBS4k1024Replicas", None,
                  ["LEARNING_RATE=1e-4", "LR_COS_WARMUP=50"]).config
    optimizer = job.task.train.learner.optimizer
    assert (optimizer.learning_rate, optimizer.lr_schedule.warmup_steps,
            optimizer.lr_schedule.decay_start, optimizer.lr_schedule.decay_end) == (
        1e-4, 50, 51, 40725)


def test_old_readme_name_is_an_alias(host):
    entry = host.components("experiments").get("C4SpmdPipelineGpt3SmallAdam8Replicas")
    assert ("paxml.tasks.lm.params.c4.C4SpmdPipelineGpt3SmallAdam64Replicas"
            in entry.component.aliases)
    resolved = resolve(host, "C4SpmdPipelineGpt3SmallAdam64Replicas", None, [])
    assert resolved.name == "lm/C4SpmdPipelineGpt3SmallAdam8Replicas"


def _first_batch_of(host, *overrides):
    job = resolve(host, "C4Spmd1BAdam4Replicas", None, list(overrides)).build()
    return job.datasets[0].peek()


def test_c4_builds_without_data_and_says_what_is_missing_when_read(host, tmp_path):
    with pytest.raises(UsageError, match="C4_SPM_MODEL"):
        _first_batch_of(host)
    model = tmp_path / "spm.model"
    model.write_bytes(b"")
    with pytest.raises(UsageError, match="C4_DATA_DIR: no such folder"):
        _first_batch_of(host, f"C4_SPM_MODEL='{model}'", "C4_DATA_DIR='/nonexistent/c4'")
    with pytest.raises(UsageError, match=r"has neither TFDS's c4-train\.array_record"):
        _first_batch_of(host, f"C4_SPM_MODEL='{model}'", f"C4_DATA_DIR='{tmp_path}'")


def test_model_sizes_are_defined_once_and_all_used():
    import re
    from pathlib import Path

    from pax_lm.experiments import sizes

    folder = Path(sizes.__file__).parent
    used = set()
    for path in folder.glob("*.py"):
        text = path.read_text()
        used |= set(re.findall(r'^@size\("([^"]+)"\)', text, re.M))
        if path.name not in ("sizes.py", "base.py"):  # base.py: the mixin's defaults
            assert not re.search(r"^    MODEL_DIMS = ", text, re.M), f"{path.name} sets a size"
    assert used == set(sizes.SIZES)


def test_paxs_target_log_pplx_sets_the_early_stop_target(host):
    stop = resolve(host, "C4Spmd1BAdam4Replicas", None,
                   ["TARGET_LOG_PPLX=3.5"]).config.task.train.early_stopping
    assert (stop.metric, stop.target, stop.higher_is_better) == ("log_pplx", 3.5, False)
