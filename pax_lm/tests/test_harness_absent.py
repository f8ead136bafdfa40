"""`pax eval --harness` where lm-eval is not installed (pax-lm without its `harness` extra, as
this session installs it): one line naming the extra to install, exit 2, before any job is
read, for pax-lm's experiments and for a user's derived from one. With lm-eval installed, the
`hf` session tests the evaluation itself (`pax_lm/tests_hf/test_harness.py`)."""

from __future__ import annotations

import importlib.util

import pytest

from pax_core.testing import run_pax

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is not None,
                                reason="lm-eval is installed here")


def test_without_lm_eval_pax_eval_harness_names_the_extra_to_install(tmp_path):
    mine = tmp_path / "mine.py"
    mine.write_text("from pax_lm import TinyLmForTests\n\n\nclass MyLm(TinyLmForTests):\n"
                    "    pass\n")
    for exp in ("TinyLmForTests", f"{mine}:MyLm"):
        result = run_pax("eval", "--harness", "hellaswag", "--exp", exp, "--job-dir",
                         str(tmp_path / "job"), "--output", str(tmp_path / "results.json"))
        assert result.returncode == 2
        assert result.stderr == ("pax: error: --harness evaluates with EleutherAI's "
                                 "lm-evaluation-harness (lm_eval), which is not installed: pip "
                                 "install 'pax-lm[harness]'\n")
    assert not (tmp_path / "job").exists() and not (tmp_path / "results.json").exists()
