"""The hardware catalogue: its files load and cite every number, target names parse into slices,
a user's file adds or corrects a chip, and each mistake is one line naming what was wrong."""

from __future__ import annotations

import fnmatch
import math
import os
import tomllib
from pathlib import Path

import pytest

from pax_core.errors import UsageError
from pax_core.speed.hardware import catalogue, chip_for_device_kind, parse_target

DATA = Path(__file__).parents[1] / "pax_core" / "speed" / "hardware" / "data"
BUILT_IN = {"tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu7x", "a100", "h100", "h100-pcie",
            "h200", "b200"}


def variant(tmp_path: Path, builtin: str, *edits: tuple[str, str], name: str = "chip") -> Path:
    """A copy of a built-in data file with ``edits`` (old, new) made, written under tmp_path."""
    text = (DATA / builtin).read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def test_the_built_in_chips_load_and_cite_every_number():
    chips = catalogue()
    assert set(chips) == BUILT_IN
    assert len(list(DATA.glob("*.toml"))) == len(BUILT_IN)  # no two files share a name
    for chip in chips.values():
        assert chip.peak_tflops["bf16"] > 0
        assert all(text.strip() for text in chip.sources.values())
        assert {"hbm_gib", "hbm_gbps", "peak_tflops.bf16", "efficiency.matmul"} <= set(
            chip.sources)
        if chip.target_prefixes:
            links = (chip.ici, chip.dcn) if chip.family == "tpu" else (chip.nvlink, chip.network)
            assert None not in links, chip.name
        if chip.ici:
            assert all(math.prod(s) == n and len(s) == chip.ici.dims
                       for n, s in chip.ici.shapes.items())


def test_the_data_files_ship_with_the_package():
    setup = tomllib.loads((DATA.parents[3] / "pyproject.toml").read_text())["tool"]["setuptools"]
    globs = setup["package-data"]["pax_core.speed.hardware"]
    for path in DATA.glob("*.toml"):
        assert any(fnmatch.fnmatch(f"data/{path.name}", g) for g in globs), path.name


@pytest.mark.parametrize(("text", "slices", "chip", "chips", "shape", "wraps"), [
    ("v4-128", 1, "tpu-v4", 64, (4, 4, 4), (True,) * 3),
    ("v4-64", 1, "tpu-v4", 32, (2, 4, 4), (False,) * 3),
    ("v5p-256", 1, "tpu-v5p", 128, (4, 4, 8), (True,) * 3),
    ("v5p-256", 2, "tpu-v5p", 256, (4, 4, 8), (True,) * 3),
    ("v5e-256", 1, "tpu-v5e", 256, (16, 16), (True, True)),
    ("v5e-128", 1, "tpu-v5e", 128, (8, 16), (False, True)),
    ("v5e-64", 1, "tpu-v5e", 64, (8, 8), (False, False)),
    ("V5litepod-16", 4, "tpu-v5e", 64, (4, 4), (False, False)),
    ("v6e-8", 1, "tpu-v6e", 8, (2, 4), (False, False)),
    ("h100-64", 1, "h100", 64, None, ()),
    ("b200-4", 1, "b200", 4, None, ()),
])
def test_targets_parse_into_chips_and_slices(text, slices, chip, chips, shape, wraps):
    target = parse_target(text, slices)
    assert (target.name, target.chip.name, target.chips, target.slices) == (
        text, chip, chips, slices if shape else 1)
    assert target.slice_shape == shape
    assert target.wraps() == wraps


@pytest.mark.parametrize(("text", "slices", "said"), [
    ("v9-8", 1, ["'v9'", "v5p, v6e"]),
    ("v5p", 1, ["'v5p'", "<chip>-<count>"]),
    ("v5p-abc", 1, ["'abc'", "not a number"]),
    ("v5p-0", 1, ["'0'"]),
    ("v5e-48", 1, ["48 chips", "1, 4, 8, 16, 32, 64, 128, 256"]),
    ("v5p-7", 1, ["7 cores", "multiple of 2"]),
    ("v5p-256", 0, ["0 slices"]),
    ("h100-64", 2, ["2 slices", "h100-128"]),
    ("h100-12", 1, ["12 GPUs", "multiple of 8"]),
    ("tpu7x-64", 1, ["2 JAX devices", "tpu7x.toml"]),
])
def test_bad_targets_say_what_is_wrong(text, slices, said):
    with pytest.raises(UsageError) as caught:
        parse_target(text, slices)
    message = str(caught.value)
    assert "\n" not in message and all(s in message for s in said), message


def test_a_user_file_adds_a_chip_and_another_corrects_one(tmp_path, monkeypatch):
    (tmp_path / "mine").mkdir()
    variant(tmp_path / "mine", "h100.toml", ('name = "h100"', 'name = "h100-lab"'),
            ('target_prefixes = ["h100"]', 'target_prefixes = ["lab"]'))
    fix = variant(tmp_path, "tpu_v5p.toml", ("hbm_gbps = 2765.0", "hbm_gbps = 2800.0"))
    monkeypatch.setenv("PAX_HARDWARE_PATH", os.pathsep.join([str(tmp_path / "mine"), str(fix)]))
    chips = catalogue()
    assert set(chips) == BUILT_IN | {"h100-lab"}
    assert chips["tpu-v5p"].hbm_gbps == 2800.0 and chips["tpu-v5p"].path == str(fix)
    assert parse_target("lab-16").chip.name == "h100-lab"
    assert parse_target("h100-16").chip.name == "h100"
    again = variant(tmp_path, "tpu_v5p.toml", ("hbm_gbps = 2765.0", "hbm_gbps = 2900.0"),
                    name="again")
    assert catalogue([str(again)])["tpu-v5p"].hbm_gbps == 2900.0  # --hardware comes last
    assert chip_for_device_kind("TPU v5p").hbm_gbps == 2765.0  # MFU reads the built-in files


@pytest.mark.parametrize(("builtin", "edits", "said"), [
    ("h100.toml", [('"hbm_gbps" = ', '# "hbm_gbps" = ')], ['sources."hbm_gbps" is missing']),
    ("h100.toml", [('"hbm_gib" = ', '"hbm_gb" = "x"\n"hbm_gib" = ')],
     ['sources."hbm_gb" names no number']),
    ("h100.toml", [("hbm_gib = 80.0\n", "")], ["hbm_gib is missing"]),
    ("h100.toml", [("hbm_gbps = 3350.0", 'hbm_gbps = "fast"')], ["hbm_gbps must be a number"]),
    ("h100.toml", [("hbm_gbps = 3350.0", "hbm_gbps = 0")], ["hbm_gbps must be positive"]),
    ("h100.toml", [("matmul = 0.803", "matmul = 80.3")], ["efficiency.matmul is 80.3"]),
    ("h100.toml", [("hbm_gbps = 3350.0", "hbm_gbps = 3350.0\nhbm_tb = 1.0")],
     ["hbm_tb is not a field"]),
    ("h100.toml", [("[nvlink]", "[nvlinks]")], ["nvlinks is not a field"]),
    ("h100.toml", [("family = \"gpu\"", "family = \"npu\"")], ["family is 'npu'"]),
    ("h100.toml", [("bf16 = 989.0, ", "")], ["peak_tflops.bf16 is missing"]),
    ("h100.toml", [("hbm_gib = 80.0", "hbm_gib = ")], ["not valid TOML"]),
    ("tpu_v5e.toml", [("8 = [2, 4]", "8 = [2, 3]")], ["ici.shapes.8 must be 2 positive"]),
    ("tpu_v5e.toml", [("[dcn]\ngbps_per_chip = 3.125\nlatency_us = 10.0\n", "")],
     ["dcn is missing"]),
    ("h100.toml", [("[sources]", "[dcn]\ngbps_per_chip = 1.0\nlatency_us = 1.0\n[sources]")],
     ["dcn is only for family 'tpu'"]),
])
def test_a_bad_user_file_is_refused_naming_the_field(tmp_path, builtin, edits, said):
    path = variant(tmp_path, builtin, *edits)
    with pytest.raises(UsageError) as caught:
        catalogue([str(path)])
    message = str(caught.value)
    assert "\n" not in message and str(path) in message, message
    assert all(s in message for s in said), message


def test_a_missing_hardware_path_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("PAX_HARDWARE_PATH", str(tmp_path / "nowhere"))
    with pytest.raises(UsageError, match="nowhere does not exist"):
        parse_target("v5p-8")


@pytest.mark.parametrize(("kind", "chip"), [
    ("TPU v4", "tpu-v4"), ("TPU v5 lite", "tpu-v5e"), ("TPU v5e", "tpu-v5e"),
    ("TPU v5", "tpu-v5p"), ("TPU v5p", "tpu-v5p"), ("TPU v6 lite", "tpu-v6e"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H200", "h200"), ("NVIDIA B200", "b200"),
    ("NVIDIA GB200", None), ("TPU7x", None), ("cpu", None),
])
def test_device_kinds_find_the_most_specific_chip(kind, chip):
    found = chip_for_device_kind(kind)
    assert (found.name if found else None) == chip
