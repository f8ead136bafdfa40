"""Runtime presets: named groups of environment variables and flags, applied before JAX starts,
the user's own values kept; the TPU backend's; the mesh layout an experiment gets."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pax_core import (
    Experiment,
    MeshLayout,
    Preset,
    TpuBackend,
    UsageError,
    apply_presets,
    parse_flags,
)
from pax_core.backends.presets import check_names
from pax_core.parallel.layouts import layout_name
from pax_core.testing import read_metrics, run_pax

FAST = Preset("fast", "two flags and a variable", env={"SPEED": "high"},
              flags={"--xla_a": "true", "--xla_b": "4"})


def test_presets_set_what_is_unset_and_keep_what_the_user_set():
    environ = {"XLA_FLAGS": "--xla_b=16 --xla_other", "SPEED": "low"}
    settings = apply_presets("gpu", [FAST], environ)
    assert parse_flags(environ["XLA_FLAGS"]) == {"--xla_b": "16", "--xla_other": "",
                                                 "--xla_a": "true"}
    assert environ["SPEED"] == "low"
    assert [s.as_text() for s in settings] == [
        "gpu.fast: SPEED=low (yours, kept)",
        "gpu.fast: XLA_FLAGS --xla_a=true",
        "gpu.fast: XLA_FLAGS --xla_b=16 (yours, kept)",
    ]


@pytest.mark.parametrize("off", ["gpu.fast", "gpu", "all", "other, gpu.fast"])
def test_a_preset_is_turned_off_by_name_by_owner_or_all(off):
    environ = {"PAX_NO_PRESETS": off}
    assert apply_presets("gpu", [FAST], environ) == []
    assert set(environ) == {"PAX_NO_PRESETS"}


def test_a_name_that_is_no_preset_is_refused():
    check_names(["gpu.fast"], {"PAX_NO_PRESETS": "gpu, gpu.fast, all"})
    with pytest.raises(UsageError, match=r"PAX_NO_PRESETS names 'gpu\.fsat', which is no "
                                         r"preset here; the presets are gpu\.fast"):
        check_names(["gpu.fast"], {"PAX_NO_PRESETS": "gpu.fsat"})


def test_the_tpu_backend_sets_pax_libtpu_flags_and_megacore():
    environ = {"LIBTPU_INIT_ARGS": "--xla_tpu_enable_latency_hiding_scheduler=false"}
    settings = apply_presets("tpu", TpuBackend().presets(), environ)
    flags = parse_flags(environ["LIBTPU_INIT_ARGS"])
    assert flags == {"--xla_tpu_enable_latency_hiding_scheduler": "false",
                     "--xla_jf_spmd_threshold_for_windowed_einsum_mib": "0",
                     "--xla_tpu_spmd_threshold_for_allgather_cse": "10000",
                     "--xla_enable_async_all_gather": "true"}
    assert environ["TPU_MEGACORE"] == "MEGACORE_DENSE"
    assert {s.preset for s in settings} == {"tpu.pax", "tpu.megacore"}


def test_an_experiment_gets_the_built_in_layout_unless_it_names_one(pax_host):
    class Sliced(Experiment):
        ICI_MESH_SHAPE, DCN_MESH_SHAPE = [1, 4, 1], [2, 1, 1]

    assert layout_name(pax_host, Sliced()) == "contiguous"  # no plugin lays slices out here
    grid = MeshLayout().device_grid(list(range(8)), [1, 4, 1], [2, 1, 1])
    assert grid.tolist() == [[[0], [1], [2], [3]], [[4], [5], [6], [7]]]
    grid = MeshLayout().device_grid(list(range(8)), [2, 2, 1], [1, 2, 1])
    assert grid[:, :2].tolist() == [[[0], [1]], [[2], [3]]]  # a slice fills the ICI part


def test_an_unknown_layout_is_one_line_and_a_run_records_its_layout(tmp_path):
    result = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(tmp_path / "bad"),
                     "--set", "MESH_LAYOUT='nowhere'")
    assert result.returncode == 2 and not (tmp_path / "bad").exists()
    assert "(set by the experiment's MESH_LAYOUT)" in result.stderr.strip().splitlines()[-1]
    good = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(tmp_path / "job"),
                   "--set", "NUM_TRAIN_STEPS=2")
    assert good.returncode == 0, good.stderr
    start = next(r for r in read_metrics(tmp_path / "job") if r["kind"] == "start")
    assert start["mesh_layout"] == "contiguous" and "presets" not in start  # CPU sets none


def test_attention_is_served_by_the_backend_the_runtime_installed(monkeypatch):
    import jax.numpy as jnp

    from pax_core import Backend, dot_product_attention
    from pax_core.backends import attention

    class Fused(Backend):
        def attention(self, query, key, value, *, mask, is_causal, segment_ids, window=0,
                      logit_cap=0.0, scale=None):
            return ("fused", is_causal, segment_ids, window, logit_cap)

    class Written119(Backend):  # a backend of API 1.19, before window, logit_cap and scale
        def attention(self, query, key, value, *, mask, is_causal, segment_ids):
            return ("1.19", is_causal, segment_ids)

    monkeypatch.setattr(attention, "_running", attention._running)
    monkeypatch.setattr(attention, "_takes_all", attention._takes_all)
    x = jnp.ones((1, 4, 2, 8))
    attention.use_backend(Fused())
    assert dot_product_attention(x, x, x, mask=None, is_causal=True, window=2, logit_cap=3.0
                                 ) == ("fused", True, None, 2, 3.0)
    attention.use_backend(Written119())
    assert dot_product_attention(x, x, x, mask=None, is_causal=True) == ("1.19", True, None)
    capped = dot_product_attention(x, x, x, mask=None, logit_cap=3.0)  # XLA serves the rest
    assert capped.shape == (1, 4, 2, 8)
    attention.use_backend(Backend())
    assert dot_product_attention(x, x, x, mask=None).shape == (1, 4, 2, 8)


PRESET_BEFORE_CONFIG = '''
import sys
import jax
from pax_core import Component, CpuBackend, ExperimentRef, Preset, hookimpl
from pax_core.examples import MlpSynthetic
from pax_core.testing import isolated_host, read_metrics, train


class FourDevices(CpuBackend):
    def presets(self):
        return [Preset("devices", "four host devices",
                       flags={"--xla_force_host_platform_device_count": "4"})]


class CountsDevices(MlpSynthetic):
    """Pax's habit: a config that asks JAX for the devices (here, a batch row per device)."""

    def task(self):
        self.BATCH_SIZE = 16 * jax.device_count()
        return super().task()


class Plugin:
    @hookimpl
    def pax_register_backends(self):
        return [Component("cpu", "__main__:FourDevices", "four host devices")]

    @hookimpl
    def pax_register_experiments(self):
        return [ExperimentRef("CountsDevices", "__main__:CountsDevices")]


train(isolated_host(("four", Plugin())), exp="CountsDevices", plugin="four",
      set_items=["NUM_TRAIN_STEPS=1"], job_dir=sys.argv[1], evaluate=False)
start = next(r for r in read_metrics(sys.argv[1]) if r["kind"] == "start")
print(jax.device_count(), start["global_batch_size"])
'''


def test_a_config_that_asks_for_the_devices_sees_the_presets_devices(tmp_path):
    """The runtime starts before the experiment makes its config, so the devices the config
    counts are the ones the presets asked for, not those of a JAX started too early."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    result = subprocess.run([sys.executable, "-c", PRESET_BEFORE_CONFIG, str(tmp_path / "job")],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-2:] == ["4", "64"]
