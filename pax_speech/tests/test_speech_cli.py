"""pax-speech from the command line, as a user runs it: train with error rates in eval,
transcribe, plan the usual ASR size, speak the demo data; and one line with exit code 2,
before anything is written, for each kind of bad input."""

from __future__ import annotations

import importlib
import json
import shutil

import numpy as np
import pytest

from pax_core import UsageError
from pax_core.testing import isolated_host, read_metrics, run_pax, train

pytestmark = pytest.mark.slow


def _settings(data) -> list[str]:
    return [f"DATA_DIR='{data}'", "BUCKET_SECONDS=(0.6, 1.5)"]


def _train_args(data, job, *more):
    return ("train", "--plugin", "speech", "--exp", "TinySpeechForTests", "--job-dir", str(job),
            *(a for item in _settings(data) for a in ("--set", item)), *more)


# Long enough to learn the tones: at 20 steps (the experiment's own) the recognizer still
# emits only blanks, and an empty transcript has error rates of exactly 1 (every character
# and word deleted), as has the untrained model. Over 200 steps it measured CER 0.07-0.15 /
# WER 0.30-0.61 at step 100 and CER 0.00-0.02 / WER 0.00-0.06 at step 200; with its encoder
# frozen (only the head learning) CER 0.83 at step 200. The steps cost seconds, the start-up
# most of the run.
STEPS = 200


@pytest.fixture(scope="module")
def trained(tone_data, tmp_path_factory):
    job = tmp_path_factory.mktemp("speech") / "job"
    result = run_pax(*_train_args(tone_data, job, "--set", f"NUM_TRAIN_STEPS={STEPS}",
                                  "--set", f"EVAL_INTERVAL_STEPS={STEPS // 2}",
                                  "--set", f"CHECKPOINT_EVERY_N_STEPS={STEPS // 2}"),
                     timeout=600)
    assert result.returncode == 0, result.stderr
    return job


def test_train_learns_and_reports_ctc_loss_and_error_rates(trained):
    records = read_metrics(trained)
    train = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval/heldout"]
    assert [r["step"] for r in evals] == [STEPS // 2, STEPS]
    assert evals[-1]["ctc_loss"] < evals[0]["ctc_loss"]
    assert {"cer", "wer", "ctc_loss", "num_utterances"} <= set(evals[-1])
    assert evals[-1]["num_utterances"] == 16  # every held-out utterance, once
    # Far below the 1.0 of a recognizer that has learnt nothing (see STEPS), with room for
    # another jax's numbers.
    assert evals[-1]["cer"] < 0.3 and evals[-1]["wer"] < 0.6
    assert train[0]["mfu"] > 0


def test_transcribe_prints_a_line_per_file(trained, tone_data):
    files = [str(tone_data / "heldout" / f"00{i}.wav") for i in (0, 1)]
    for decoder in ("greedy", "beam"):
        result = run_pax("transcribe", "--plugin", "speech", "--job-dir", str(trained), *files,
                         "--decoder", decoder)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.strip().splitlines()
        assert len(lines) == 2 and all(line.startswith(f"[step {STEPS}] ") for line in lines)
        assert all(set(line.partition(": ")[2]) <= set(" 'abcdefghijklmnopqrstuvwxyz")
                   for line in lines)
    bad = run_pax("transcribe", "--plugin", "speech", "--job-dir", str(trained),
                  str(tone_data / "missing.wav"))
    assert bad.returncode == 2 and "no such audio file" in bad.stderr


def _spoil(data, tmp_path, case: str) -> str:
    """A copy of the tone data with one kind of fault; returns what the message must say."""
    shutil.copytree(data, tmp_path / "data")
    manifest = tmp_path / "data" / "train.jsonl"
    lines = manifest.read_text().splitlines()
    first = json.loads(lines[0])
    if case == "missing audio":
        first["audio"] = "train/nowhere.wav"
        expected = "nowhere.wav"
    elif case == "not audio":
        (tmp_path / "data" / first["audio"]).write_text("not a sound file")
        expected = "000.wav"
    elif case == "other rate":
        import soundfile

        soundfile.write(tmp_path / "data" / first["audio"], np.zeros(8000), 8000)
        expected = "8000 Hz"
    elif case == "outside the vocabulary":
        first["text"] = "abc 42!"
        expected = "'42!'"
    else:
        manifest.write_text("")
        return "no utterances"
    lines[0] = json.dumps(first)
    manifest.write_text("\n".join(lines) + "\n")
    return expected


BAD_INPUTS = ["missing audio", "not audio", "other rate", "outside the vocabulary", "empty"]


def test_bad_input_is_one_line_and_exit_2_with_nothing_written(tone_data, tmp_path):
    """Through the ``pax`` command, one kind of bad input; every kind is the next test's."""
    expected = _spoil(tone_data, tmp_path, BAD_INPUTS[0])
    job = tmp_path / "job"
    result = run_pax(*_train_args(tmp_path / "data", job, "--set", "ON_OTHER_RATE='refuse'"))
    assert result.returncode == 2, result.stderr
    message = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(message) == 1 and expected in message[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not job.exists() or not any(job.iterdir())


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_each_bad_input_is_refused_before_anything_is_written(tone_data, tmp_path, capfd,
                                                               case):
    """``pax train`` in this process: the usage error (exit 2) that the command prints as its
    one line, and nothing else said (the test above)."""
    expected = _spoil(tone_data, tmp_path, case)
    job = tmp_path / "job"
    host = isolated_host(("speech", importlib.import_module("pax_speech.plugin")),
                         ("transformer", importlib.import_module("pax_transformer.plugin")))
    with pytest.raises(UsageError) as refused:
        train(host, exp="TinySpeechForTests", plugin="speech", job_dir=str(job),
              set_items=[*_settings(tmp_path / "data"), "ON_OTHER_RATE='refuse'"])
    message = str(refused.value)
    assert expected in message and "\n" not in message and refused.value.exit_code == 2
    assert capfd.readouterr().err == ""
    assert not job.exists() or not any(job.iterdir())


def test_plan_compiles_the_usual_asr_size_on_its_mesh():
    result = run_pax("plan", "--plugin", "speech", "--exp", "ConformerCtcM", "--json",
                     timeout=600)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["params"] == 26_278_173
    assert plan["mesh"] == {"replica": 1, "data": 8, "mdl": 1}


@pytest.mark.skipif(not all(shutil.which(t) for t in ("flite", "espeak-ng", "sox")),
                    reason="the demo data needs Debian's flite, espeak-ng and sox")
def test_make_demo_data_writes_manifests_the_quick_start_reads(tmp_path):
    out = tmp_path / "demo"
    result = run_pax("speech", "make-demo-data", str(out), "--utterances", "24",
                     "--heldout", "4", timeout=300)
    assert result.returncode == 0, result.stderr
    for name, count in (("train", 24), ("heldout", 4)):
        assert len((out / f"{name}.jsonl").read_text().splitlines()) == count
    again = run_pax("speech", "make-demo-data", str(out))
    assert again.returncode == 2 and "not an empty folder" in again.stderr
