"""Speed accounting: the step-time breakdown, MFU and HFU, and the peak FLOP/s they divide by."""

from __future__ import annotations

import json

import jax
import pytest

from pax_core.loggers.console import speed_line
from pax_core.speed import peak as peak_module
from pax_core.speed.clock import StepClock, Utilisation
from pax_core.speed.flops import StepFlops
from pax_core.speed.peak import Peak, device_peak, measured_cpu_peak, table_peak


class FakeTime:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def fake_time(monkeypatch):
    clock = FakeTime()
    monkeypatch.setattr("pax_core.speed.clock.time.perf_counter", clock)
    return clock


def test_phases_add_up_and_steps_per_sec_leaves_eval_out(fake_time):
    clock = StepClock()
    for _ in range(4):  # 4 steps: 10 ms input and 40 ms step each
        fake_time.now += 0.010
        clock.charge("input")
        fake_time.now += 0.040
        clock.charge("step")
    fake_time.now += 0.300
    clock.charge("eval")
    fake_time.now += 0.100
    clock.charge("checkpoint")
    fake_time.now += 0.020  # the summary itself, charged to the step by ``lap``
    steps_per_sec, breakdown = clock.lap(4)
    assert breakdown == pytest.approx({"time_input_ms": 10.0, "time_step_ms": 45.0,
                                       "time_checkpoint_ms": 25.0, "time_eval_ms": 75.0})
    assert steps_per_sec == pytest.approx(4 / (0.04 + 0.18 + 0.1))
    # The next interval starts empty.
    fake_time.now += 0.5
    assert clock.lap(1)[1]["time_step_ms"] == pytest.approx(500.0)


def test_mfu_and_hfu_are_per_device_rates_over_the_device_peak():
    flops = StepFlops(model=8e12, formula="transformer-v1", hardware=1e13)
    use = Utilisation(flops, Peak(100e12, "table"), num_devices=4)
    assert use.metrics(steps_per_sec=10.0) == pytest.approx(
        {"model_tflops_per_device": 20.0, "mfu": 0.2, "hfu": 0.25})
    assert use.settings()["flops_formula"] == "transformer-v1"
    assert use.settings()["peak_tflops_per_device"] == pytest.approx(100.0)


def test_without_a_formula_or_a_peak_only_what_is_known_is_reported():
    no_formula = Utilisation(StepFlops(None, None, 1e12), Peak(1e12, "x"), 1)
    assert no_formula.metrics(1.0) == {"hfu": 1.0}
    assert no_formula.settings()["model_flops_per_step"] is None
    assert "model FLOPs per step unknown (the model has no FLOP formula)" in speed_line(
        no_formula.settings())
    no_peak = Utilisation(StepFlops(2e12, "f", 1e12), None, 2)
    assert no_peak.metrics(1.0) == {"model_tflops_per_device": 1.0}
    assert no_peak.settings()["peak_source"] == "unknown device kind"
    assert "no peak FLOP/s (unknown device kind; set --peak-tflops)" in speed_line(
        no_peak.settings())


@pytest.mark.parametrize(("kind", "tflops"), [
    ("TPU v4", 275), ("TPU v5 lite", 197), ("TPU v5e", 197), ("TPU v5", 459), ("TPU v5p", 459),
    ("TPU v6 lite", 918), ("NVIDIA A100-SXM4-80GB", 312), ("NVIDIA H100 80GB HBM3", 989),
    ("NVIDIA H100 PCIe", 756), ("NVIDIA H200", 989), ("Some Future Chip", None),
])
def test_peak_table_knows_the_device_kinds(kind, tflops):
    assert table_peak(kind) == tflops


def test_cpu_peak_is_measured_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("PAX_CACHE_DIR", str(tmp_path))
    measured = measured_cpu_peak()
    assert measured > 1e8  # any CPU that runs these tests does 0.1 GFLOP/s
    cache = json.loads((tmp_path / "cpu_peak.json").read_text())
    assert list(cache.values()) == [measured]

    def must_not_measure(*args, **kwargs):
        raise AssertionError("measured again despite the cache")

    monkeypatch.setattr(peak_module, "matmul_flops_per_sec", must_not_measure)
    assert measured_cpu_peak() == measured


def test_a_corrupt_cache_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setenv("PAX_CACHE_DIR", str(tmp_path))
    (tmp_path / "cpu_peak.json").write_text("{not json")
    monkeypatch.setattr(peak_module, "matmul_flops_per_sec", lambda *a, **k: 5e9)
    assert measured_cpu_peak() == 5e9
    assert 5e9 in json.loads((tmp_path / "cpu_peak.json").read_text()).values()


def test_fake_cpu_devices_share_the_host_peak(tmp_path, monkeypatch):
    monkeypatch.setenv("PAX_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(peak_module, "matmul_flops_per_sec", lambda *a, **k: 8e10)
    devices = jax.devices()
    assert len(devices) == 8
    assert device_peak(devices).flops_per_sec == pytest.approx(1e10)
    assert device_peak(devices, override_tflops=2.5) == Peak(2.5e12, "--peak-tflops")
