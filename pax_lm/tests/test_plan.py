"""`pax plan` compiles every registered LM experiment on fake devices: the SPMD ones that fit
512 devices, and every pipelined one (up to 1024 devices).

The experiments that plan on the same number of devices (8 for Pax's data-parallel path, 512 for
a declared mesh, 1024 for the pipelined) are planned one after another in one fresh process with
that many fake CPU devices (the test process has 8): nothing is allocated, no data is read. Three
things keep the sweep short without changing what it checks:

* a variant that changes only its base's step count (Pax's ``LimitSteps`` experiments) trains
  its base's program, which is planned: it is checked to differ only there, not planned again
  (tracing and lowering it took as long as its base);
* the process uses the test run's compilation cache, so an experiment whose train step is the
  same program as one planned before it (in this run or an earlier one) loads it instead of
  compiling it again, with the same plan;
* the process compiles as every test does (``pax_core.testing.cpu_xla_flags``: XLA's legacy
  element-wise emitters in place of its MLIR fusion emitters, whose machine code a plan never
  runs, and which took half of the sweep's time). The program is partitioned for the
  experiment's mesh as before; only the CPU's fusion, and with it the temporaries' size, can
  differ, and no check here reads them. ``pax plan`` as a user runs it, fusion emitters on, is
  ``test_pax_plan_command_reports_and_judges_the_fit`` (and the speech and vision plans').
"""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys

import pytest
from test_catalogue import decoder_fields, expected_count

from pax_core.testing import cpu_xla_flags
from pax_lm.experiments.base import PipelinedExperiment
from pax_lm.experiments.catalogue import EXPERIMENTS

MAX_DEVICES = 512
# The weights a token multiplies in the sparse models, as published (Mixtral's announcements:
# 12.9B and 39B) and exactly from their configurations.
PUBLISHED_ACTIVE = {"Mixtral8x7B": 12_879_925_248, "Mixtral8x22B": 39_161_468_928,
                    "DeepSeekMoE16B": 2_828_650_496}
PIPELINE_DEVICES = 1024

PLAN_SCRIPT = """
import json, sys
from pax_core import testing
from pax_core.run.compilation_cache import use_compilation_cache
testing.use_fake_devices(int(sys.argv[1]))
use_compilation_cache()
host = testing.PluginHost()
for name in sys.argv[2:]:
    print("PLAN", json.dumps(testing.plan(host, exp=name, plugin="lm", set_items=[]).as_json()),
          flush=True)
"""


def _load(ref):
    module, _, name = ref.target.partition(":")
    return getattr(importlib.import_module(module), name)


CATALOGUE_NAMES = {ref.name for ref in EXPERIMENTS}


def _step_count_variant(cls: type) -> bool:
    """Whether ``cls`` is its base experiment with another ``NUM_TRAIN_STEPS`` and nothing else,
    no method either (Pax's ``LimitSteps`` variants): its train step is its base's program."""
    own = {name for name in vars(cls) if not name.startswith("__")}
    return own == {"NUM_TRAIN_STEPS"} and cls.__bases__[0].__name__ in CATALOGUE_NAMES


def _plannable() -> list[tuple[int, str]]:
    """(devices to plan on, name): a declared mesh's size, or 8 devices for Pax's
    data-parallel path; SPMD meshes over 512 devices are left out, and so are step-count
    variants, whose program is their base's (``test_step_count_variants_differ_only_there``)."""
    out = []
    for ref in EXPERIMENTS:
        cls = _load(ref)
        if _step_count_variant(cls):
            continue
        if issubclass(cls, PipelinedExperiment):
            out.append((PIPELINE_DEVICES, ref.name))
        elif (cls.mesh_size() or 8) <= MAX_DEVICES:
            out.append((MAX_DEVICES if cls.ICI_MESH_SHAPE is not None else 8, ref.name))
    return out


PLANNABLE = _plannable()
GROUPS = [(devices, [n for d, n in PLANNABLE if d == devices])
          for devices in (8, MAX_DEVICES, PIPELINE_DEVICES)]


@pytest.mark.parametrize(("devices", "names"), GROUPS, ids=[f"{g[0]}-devices" for g in GROUPS])
def test_experiments_compile_on_their_mesh(devices, names):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    result = subprocess.run([sys.executable, "-c", PLAN_SCRIPT, str(devices), *names],
                            capture_output=True, text=True, timeout=900,
                            env={**env, "XLA_FLAGS": cpu_xla_flags(devices)})
    assert result.returncode == 0, result.stderr[-3000:]
    plans = [json.loads(line[len("PLAN "):]) for line in result.stdout.splitlines()
             if line.startswith("PLAN ")]
    assert [p["experiment"] for p in plans] == [f"lm/{n}" for n in names]
    for name, p in zip(names, plans, strict=True):
        exp = _load(next(e for e in EXPERIMENTS if e.name == name))()
        assert p["params"] == expected_count(name, exp), name
        assert p["active_params"] == PUBLISHED_ACTIVE.get(name, p["active_params"]), name
        assert (p["active_params"] < p["params"]) == bool(exp.NUM_EXPERTS), name
        assert p["devices"] == math.prod(p["mesh"].values())
        assert p["model_flops_per_step"] > 0 and p["hardware_flops_per_step"] > 0
        assert 0 < p["params_gib"] < p["total_gib"]
        if isinstance(exp, PipelinedExperiment):
            _check_pipeline(exp, p)


def _check_pipeline(exp, plan):
    """The plan reports the schedule the experiment declares, and the bubble formula's value."""
    facts, stages = plan["placement"], exp.NUM_STAGES
    batch = exp.global_batch_size()
    micro = exp.NUM_MICROBATCHES or batch // exp.MICROBATCH_SIZE
    iterations = micro * exp.CIRCULAR_REPEAT + stages - 1
    assert plan["mesh"]["stage"] == stages
    assert (facts["pipeline_stages"], facts["pipeline_microbatches"],
            facts["pipeline_iterations"]) == (stages, micro, iterations)
    assert facts["pipeline_bubble"] == pytest.approx((stages - 1) / iterations)


def test_step_count_variants_differ_only_there():
    """A variant left out of the sweep trains its base's program: the same decoder and mesh,
    another step count; its base is planned."""
    variants = [ref for ref in EXPERIMENTS if _step_count_variant(_load(ref))]
    assert len(variants) >= 9
    planned = {name for _, name in PLANNABLE}
    for ref in variants:
        cls = _load(ref)
        base = cls.__bases__[0]
        assert base.__name__ in planned, ref.name
        assert cls.NUM_TRAIN_STEPS != base.NUM_TRAIN_STEPS, ref.name
        variant, original = cls(), base()
        assert decoder_fields(variant) == decoder_fields(original), ref.name
        assert (variant.mesh_size(), variant.global_batch_size()) == (
            original.mesh_size(), original.global_batch_size()), ref.name


def test_plannable_experiments_cover_the_catalogue():
    assert len(PLANNABLE) >= 44
    pipelined = [name for devices, name in PLANNABLE if devices == PIPELINE_DEVICES]
    assert len(pipelined) == 12 and "LmCloudSpmdPipeline175B" in pipelined
    assert {"LmCloudSpmd2B", "C4Spmd16BAdam32Replicas", "LmCloudSpmd256B",
            "C4Spmd22BAdam2xv4_128", "QuickStartLm", "Mixtral8x7B", "Mixtral8x22B",
            "GLaM126M64E", "GLaM64B64E", "DeepSeekMoE16B"} <= {name for _, name in PLANNABLE}


def test_pax_plan_command_reports_and_judges_the_fit():
    pax = os.path.join(os.path.dirname(sys.executable), "pax")
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    result = subprocess.run([pax, "plan", "--plugin", "lm", "--exp", "LmCloudSpmd2B", "--json",
                             "--hbm-gib", "16"], capture_output=True, text=True, timeout=120,
                            env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert report["devices"] == 4 and report["mesh"] == {"replica": 1, "data": 4, "mdl": 1}
    exp = _load(next(e for e in EXPERIMENTS if e.name == "LmCloudSpmd2B"))()
    assert report["params"] == expected_count("LmCloudSpmd2B", exp)
    assert report["fits"] == (report["total_gib"] <= 16)
    small = subprocess.run([pax, "plan", "--plugin", "lm", "--exp", "LmCloudSpmd2B",
                            "--set", "ICI_MESH_SHAPE=[1,3,1]"], capture_output=True, text=True,
                           timeout=120, env=env)
    assert small.returncode == 0, small.stderr[-2000:]
    assert "devices (mesh)" in small.stdout and "3 (replica 1 x data 3 x mdl 1)" in small.stdout
