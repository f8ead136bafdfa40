"""`pax eval --harness`'s part in the core: the harness a job is evaluated with is its
experiment plugin's (or that of the nearest base class whose plugin has one), found before JAX
starts; a job no installed harness evaluates, and the harness options without `--harness`, are
one line and exit 2."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from pax_core.errors import RunError, UsageError
from pax_core.testing import isolated_host, run_pax

PLUGIN = '''
from pax_core import Component, ExperimentRef, hookimpl
from pax_core.examples import MlpSynthetic

PAX_API = ">=1.16,<2"
HARNESSES = ["quiz"]


class QuizExperiment(MlpSynthetic):
    pass


def evaluate(job, tasks, *, limit=None, num_fewshot=None):
    return {"step": 0, "results": {}}


@hookimpl
def pax_register_experiments():
    return [ExperimentRef("QuizExperiment", "harness_demo:QuizExperiment")]


@hookimpl
def pax_register_harnesses():
    return [Component(name, "harness_demo:evaluate") for name in HARNESSES]
'''


@pytest.fixture
def demo(tmp_path, monkeypatch):
    """A plugin module with an experiment and a harness, and a file of the user's with an
    experiment derived from the plugin's."""
    (tmp_path / "harness_demo.py").write_text(textwrap.dedent(PLUGIN))
    (tmp_path / "mine.py").write_text("from harness_demo import QuizExperiment\n\n\n"
                                      "class MyQuiz(QuizExperiment):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield importlib.import_module("harness_demo")
    sys.modules.pop("harness_demo")


def test_the_harness_is_the_experiment_plugins_or_its_nearest_bases(demo, tmp_path):
    from pax_core.commands.jobs import harness_for

    host = isolated_host(("demo", demo))
    job = str(tmp_path / "job")
    for exp in ("QuizExperiment", f"{tmp_path / 'mine.py'}:MyQuiz"):
        entry = harness_for(host, exp=exp, plugin=None, set_items=[], job_dir=job)
        assert (entry.qualified_name, entry.load()) == ("demo/quiz", demo.evaluate)
    with pytest.raises(UsageError, match=r"^--harness: no installed plugin provides a harness "
                                         r"evaluation for experiment core/MlpSynthetic; the "
                                         r"harnesses installed \(demo/quiz \(.*\)\) evaluate "
                                         r"their own plugins' experiments$"):
        harness_for(host, exp="MlpSynthetic", plugin=None, set_items=[], job_dir=job)
    with pytest.raises(UsageError, match=r"no installed plugin registers one \(pax-lm does, "
                                         r"for language models: pip install 'pax-lm\[harness\]'"):
        harness_for(isolated_host(), exp="MlpSynthetic", plugin=None, set_items=[],
                    job_dir=job)
    demo.HARNESSES.append("exam")
    with pytest.raises(RunError, match=r"^plugin 'demo' registers 2 harnesses \(quiz, exam\); a "
                                       r"plugin registers at most one$"):
        harness_for(isolated_host(("demo", demo)), exp="QuizExperiment", plugin=None,
                    set_items=[], job_dir=job)
    assert not (tmp_path / "job").exists()


def test_pax_eval_harness_refuses_what_it_cannot_do_in_one_line(tmp_path):
    none = run_pax("eval", "--harness", "hellaswag", "--exp", "MlpSynthetic", "--job-dir",
                   str(tmp_path / "job"))
    assert none.returncode == 2
    assert none.stderr.startswith("pax: error: --harness: no installed plugin provides a "
                                  "harness evaluation for experiment core/MlpSynthetic; ")
    assert none.stderr.count("\n") == 1
    misplaced = run_pax("eval", "--job-dir", str(tmp_path / "job"), "--num-fewshot", "2",
                        "--output", str(tmp_path / "results.json"))
    assert misplaced.returncode == 2
    assert misplaced.stderr == ("pax: error: --num-fewshot, --output go with --harness TASKS; "
                                "the eval datasets' results are printed (--json for JSON)\n")
    assert list(tmp_path.iterdir()) == []
