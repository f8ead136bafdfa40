"""The experiments pax-lm registers, by module, with the Pax paths users already type.

Kept as plain data so that listing them imports nothing: each class is imported only when a run
uses it.
"""

from __future__ import annotations

from pax_core import ExperimentRef

_PAX_MODULES = {
    "lm_cloud": "paxml.tasks.lm.params.lm_cloud",
    "c4": "paxml.tasks.lm.params.c4",
    "c4_multislice": "paxml.tasks.lm.params.c4_multislice",
}

_BY_MODULE = {
    "lm_cloud": [
        "LmCloudTransformerAdam", "LmCloudTransformerAdamTest", "LmCloudTransformerAdamLimitSteps",
        "LmCloudSpmd", "LmCloudSpmdTest", "LmCloudSpmd2B", "LmCloudSpmd2BLimitSteps",
        "LmCloudSpmd32B", "LmCloudSpmd64B", "LmCloudSpmd128B", "LmCloudSpmd256B",
        "LmCloudSpmd512B", "LmCloudSpmd1024B", "LmCloudSpmdMultislice2B",
        "LmCloudSpmdPipeline9B", "LmCloudSpmdPipeline175B", "LmCloudSpmdPipelineMultislice2B",
        "LmCloudSpmdPipelineMultislice2BCircular",
    ],
    "c4": [
        "C4Spmd1BAdam4Replicas", "C4Spmd2BAdam4Replicas", "C4Spmd16BAdam32Replicas",
        "C4Spmd32BAdam64Replicas", "C4Spmd1BAdam4ReplicasLimitSteps",
        "C4Spmd2BAdam4ReplicasLimitSteps", "C4Spmd16BAdam32ReplicasLimitSteps",
        "C4Spmd32BAdam64ReplicasLimitSteps", "LmCloudSpmdAdam", "LmCloudSpmdAdamLimitSteps",
        "C4SpmdGpt3AdamOrgHPBS1p5k1536Replicas", "C4SpmdGpt3L16AdamOrgHP",
        "C4SpmdPipelineGpt3AdamOrgHPBS1p5k768Replicas",
        "C4SpmdPipelineGpt3AdamMLPerfHPBS1p5k768Replicas",
        "C4SpmdPipelineGpt3AdamMLPerfHPBS2k512Replicas",
        "C4SpmdPipelineGpt3AdamMLPerfHPBS3k768Replicas",
        "C4SpmdPipelineGpt3AdamMLPerfHPBS4k1024Replicas",
        "C4SpmdPipelineGpt3AdamMLPerfHPBS8k1024Replicas",
        "C4SpmdPipelineGpt3SmallAdam8Replicas",
    ],
    "c4_multislice": [
        "C4Spmd22BAdamMaxText", "C4Spmd22BAdam1xv4_128", "C4Spmd22BAdam2xv4_128",
        "C4Spmd22BAdam4xv4_128", "C4Spmd22BAdam1xv4_384", "C4Spmd22BAdam2xv4_384",
        "C4Spmd22BAdam1xv4_8", "C4Spmd22BAdam2xv4_8", "C4Spmd22BAdam4xv4_8",
        "C4Spmd32BAdam1xv5_256", "C4Spmd32BAdam2xv5_256", "C4SpmdGpt3AdamDataParallel2x16x16",
        "C4Spmd22BAdam1xv4_128LimitSteps", "C4Spmd22BAdam2xv4_128LimitSteps",
        "C4Spmd22BAdam4xv4_128LimitSteps", "C4Spmd22BAdam1xv4_8LimitSteps",
        "C4Spmd22BAdam2xv4_8LimitSteps", "C4Spmd22BAdam4xv4_8LimitSteps",
    ],
}

# The published sizes of the open families (open_models.py), by name.
_OPEN_MODELS = {
    "Llama3_1_8B": "Llama 3.1 8B", "Llama3_1_70B": "Llama 3.1 70B", "Llama3_2_1B": "Llama 3.2 1B",
    "Llama3_2_3B": "Llama 3.2 3B", "Mistral7B": "Mistral 7B", "Qwen2_5_7B": "Qwen 2.5 7B",
    "Qwen3_8B": "Qwen 3 8B", "Gemma2_9B": "Gemma 2 9B", "Gemma3_4B": "Gemma 3 4B's text decoder",
    "Mixtral8x7B": "Mixtral 8x7B (2 of 8 experts a token)",
    "Mixtral8x22B": "Mixtral 8x22B (2 of 8 experts a token)",
}

# Mixture-of-Experts LMs at published sizes (moe.py).
_MOE_MODELS = {
    "GLaM126M64E": "GLaM 126M/64E (about 1.9B weights), experts over 64 devices",
    "GLaM64B64E": "GLaM 64B/64E (1.2T weights, 96.6B a token), on 512 devices",
    "DeepSeekMoE16B": "DeepSeekMoE 16B (16.4B weights, 2.8B a token; shared experts)",
}

# Names Pax's README used for classes that were renamed since.
_OLD_NAMES = {"C4SpmdPipelineGpt3SmallAdam8Replicas": ("C4SpmdPipelineGpt3SmallAdam64Replicas",)}


def _ref(module: str, name: str) -> ExperimentRef:
    pax_path = _PAX_MODULES[module]
    aliases = [f"{pax_path}.{name}"]
    aliases += [f"{pax_path}.{old}" for old in _OLD_NAMES.get(name, ())]
    return ExperimentRef(name, f"pax_lm.experiments.{module}:{name}", f"Pax {module}",
                         aliases=tuple(aliases))


EXPERIMENTS: list[ExperimentRef] = [
    *(_ref(module, name) for module, names in _BY_MODULE.items() for name in names),
    ExperimentRef("QuickStartLm", "pax_lm.experiments.quickstart:QuickStartLm",
                  "1.8M-parameter GPT on the King James Bible, bytes; minutes on a laptop CPU"),
    ExperimentRef("OpenWeightsLm", "pax_lm.experiments.open_weights:OpenWeightsLm",
                  "an imported open-weights decoder (pax import hf), continued on text"),
    *(ExperimentRef(name, f"pax_lm.experiments.open_models:{name}", f"{label} (open weights: "
                    f"pax import hf its folder, or --init-from it)")
      for name, label in _OPEN_MODELS.items()),
    *(ExperimentRef(name, f"pax_lm.experiments.moe:{name}", label)
      for name, label in _MOE_MODELS.items()),
    ExperimentRef("QuickStartMoeLm", "pax_lm.experiments.quickstart:QuickStartMoeLm",
                  "the quick start as a Mixture-of-Experts: 2 of 8 experts a token, as many "
                  "weights a token"),
    ExperimentRef("LlamaBench470M", "pax_lm.experiments.benchmarks:LlamaBench470M",
                  "the one-chip speed benchmark: llama-style, 470M weights, 8 x 2,048 random "
                  "tokens a step (bench/tpu_train.py)"),
    ExperimentRef("LlamaBench1B", "pax_lm.experiments.benchmarks:LlamaBench1B",
                  "the 1B-class one-chip benchmark: 1.2B weights, Adafactor"),
    ExperimentRef("TinyLmForTests", "pax_lm.experiments.quickstart:TinyLmForTests",
                  "the smallest LM that learns: for tests"),
    ExperimentRef("TinyPipelinedLmForTests",
                  "pax_lm.experiments.quickstart:TinyPipelinedLmForTests",
                  "the tests' LM as a 2-stage GPipe pipeline on 8 devices (pax-pipeline)"),
    ExperimentRef("TinyMoeLmForTests", "pax_lm.experiments.quickstart:TinyMoeLmForTests",
                  "the tests' LM with 2 of 4 experts a token, split over an expert axis of 4"),
]
