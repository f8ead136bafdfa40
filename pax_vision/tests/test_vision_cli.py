"""pax-vision from the command line, as a user runs it: train, evaluate and predict, and one
line with exit code 2, before anything is written, for each kind of bad input."""

from __future__ import annotations

import gzip
import importlib
import json

import numpy as np
import pytest
from PIL import Image

from pax_core import UsageError
from pax_core.testing import isolated_host, read_metrics, run_pax, train
from pax_vision.inputs.arrays import IDX_IMAGES, IDX_LABELS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def digits():
    """scikit-learn's UCI digits (pax-vision's ``digits`` extra), which TinyDigitsForTests
    reads: only the tests of that experiment need them."""
    return pytest.importorskip("sklearn.datasets").load_digits()


@pytest.fixture(scope="module")
def trained(digits, tmp_path_factory):
    job = tmp_path_factory.mktemp("digits") / "job"
    result = run_pax("train", "--plugin", "vision", "--exp", "TinyDigitsForTests",
                     "--job-dir", str(job), timeout=300)
    assert result.returncode == 0, result.stderr
    return job


def test_train_learns_and_reports_pax_metrics(trained):
    evals = [r for r in read_metrics(trained) if r["kind"] == "eval/heldout"]
    assert evals and {"accuracy", "acc5", "avg_xent", "error", "num_predictions"} <= set(
        evals[-1])
    assert evals[-1]["num_predictions"] == 360  # every held-out image, once
    assert evals[-1]["accuracy"] > 0.4  # from 0.1 by chance, in 40 steps
    assert evals[-1]["avg_xent"] < evals[0]["avg_xent"]


def test_predict_names_the_class_of_an_image(trained, digits, tmp_path):
    paths = []
    for i in (0, 1):  # training images, so a 40-step model knows them
        path = tmp_path / f"{i}.png"
        Image.fromarray(np.uint8(digits.images[i] * 255 / 16)).save(path)
        paths.append(str(path))
    result = run_pax("predict", "--plugin", "vision", "--job-dir", str(trained), *paths,
                     "--top", "2")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("[step 40]") for line in lines)
    shown = [line.split(": ", 1)[1].split(", ") for line in lines]
    probabilities = [float(entry.split()[1]) for entries in shown for entry in entries]
    assert [len(entries) for entries in shown] == [2, 2]
    assert all(0 <= p <= 1 for p in probabilities) and probabilities[0] >= probabilities[1]
    bad = run_pax("predict", "--plugin", "vision", "--job-dir", str(trained),
                  str(tmp_path / "missing.png"))
    assert bad.returncode == 2 and "no such image file" in bad.stderr


def _refused(job, *args) -> str:
    """``pax train`` as a user runs it: exit 2, nothing written; what it printed."""
    result = run_pax("train", "--plugin", "vision", "--job-dir", str(job), *args)
    assert result.returncode == 2, result.stderr
    assert not job.exists(), "nothing is written for a usage error"
    return result.stderr.strip()


def _refused_here(job, exp: str, *items: str) -> str:
    """``pax train`` in this process: the usage error (exit 2) that ``_refused`` sees printed
    (``test_a_folder_without_class_subfolders`` runs the command itself), nothing written."""
    host = isolated_host(("vision", importlib.import_module("pax_vision.plugin")))
    with pytest.raises(UsageError) as refused:
        train(host, exp=exp, plugin="vision", set_items=list(items), job_dir=str(job))
    assert refused.value.exit_code == 2
    assert not job.exists(), "nothing is written for a usage error"
    return str(refused.value)


def test_a_folder_without_class_subfolders(tmp_path):
    (tmp_path / "train").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "train" / "a.png")
    message = _refused(tmp_path / "job", "--exp", "ResNet18Pjit",
                       "--set", f"IMAGENET_DIR='{tmp_path}'", "--set", "IMAGENET_FORMAT='folder'")
    assert f"{tmp_path / 'train'}: no class subfolders" in message
    assert len(message.splitlines()) == 1, message


@pytest.mark.usefixtures("digits")
def test_images_of_another_size_than_the_model_takes(tmp_path):
    message = _refused_here(tmp_path / "job", "TinyDigitsForTests", "datasets[0].image_size=12")
    assert "images are 12x12 but the model takes 8x8" in message


def test_an_idx_file_of_the_wrong_magic_number(tmp_path):
    for stem in ("train", "t10k"):
        for name, magic in ((f"{stem}-images-idx3-ubyte.gz", IDX_LABELS),
                            (f"{stem}-labels-idx1-ubyte.gz", IDX_LABELS)):
            header = magic.to_bytes(4, "big") + (4).to_bytes(4, "big")
            with gzip.open(tmp_path / name, "wb") as f:
                f.write(header + bytes(4))
    message = _refused_here(tmp_path / "job", "MnistExperiment", f"DATA_DIR='{tmp_path}'")
    assert f"magic number {IDX_LABELS}, expected {IDX_IMAGES}" in message


@pytest.mark.usefixtures("digits")
def test_a_class_count_other_than_the_models(tmp_path):
    message = _refused_here(tmp_path / "job", "TinyDigitsForTests", "NUM_CLASSES=5")
    assert "the data has 10 classes but the model has 5" in message


def test_plan_compiles_the_imagenet_models_on_their_mesh():
    for exp in ("ResNet50Pjit", "ViTB16Pjit"):
        result = run_pax("plan", "--plugin", "vision", "--exp", exp, "--json", timeout=600)
        assert result.returncode == 0, result.stderr
        plan = json.loads(result.stdout)
        assert plan["devices"] == 8 and plan["mesh"] == {"replica": 1, "data": 8, "mdl": 1}
        assert plan["model_flops_per_step"] > 0 and plan["params"] > 2e7
