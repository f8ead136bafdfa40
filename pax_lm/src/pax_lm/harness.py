"""``pax eval --harness TASKS`` for language models: EleutherAI's lm-evaluation-harness
(lm-eval, the ``pax-lm[harness]`` extra) on a job's checkpoint.

lm-eval brings datasets, pandas and scikit-learn, which nothing else in Pax needs, so it is an
extra, imported only here and only when an evaluation runs. What can be wrong is found before
the job is restored: lm-eval missing (the line names the extra to install), every task name
looked up in lm-eval's index of tasks (a name, or a task's YAML file; an unknown one is named
with the closest names lm-eval has), and every task built once, its data fetched or found in
the datasets cache (data that cannot be read is one line). The model side is
``pax_lm.harness_model.PaxLM``: lm-eval's requests answered by Pax's batched scoring and
decoding.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pax_core import JobRequest, RunError, UsageError

INSTALL = "pip install 'pax-lm[harness]'"
BATCH_SIZE = 8  # requests scored, or decoded, at once
# lm-eval's report beside its results, kept in the JSON that --output writes (its per-document
# samples are not: they can be larger than everything else together).
REPORTED = ("groups", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better",
            "n-samples")


def evaluate(job: JobRequest, tasks: list[str], *, limit: int | None = None,
             num_fewshot: int | None = None) -> dict[str, Any]:
    """Evaluate ``job`` on lm-eval's ``tasks`` (at most ``limit`` documents each, with
    ``num_fewshot`` examples before each when given); the checkpoint's step, each task's
    metrics (lm-eval's names, its filter added after a slash when it is not ``none``), and
    lm-eval's own report of the run."""
    manager = task_manager()
    check_tasks(manager, tasks)
    load_tasks(manager, tasks)
    from lm_eval import __version__ as lm_eval_version
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.utils import handle_non_serializable

    from pax_lm.harness_model import PaxLM

    model = PaxLM.from_job(job, BATCH_SIZE)
    # lm-eval prints progress to stdout here and there: it goes to stderr, so that stdout
    # holds Pax's results alone (``--json`` is read by scripts).
    with contextlib.redirect_stdout(sys.stderr), _sequential_bootstrap():
        out = simple_evaluate(model=model, tasks=list(tasks), num_fewshot=num_fewshot,
                              limit=limit, task_manager=manager, log_samples=False)
    report = {key: out[key] for key in REPORTED if key in out}
    report = json.loads(json.dumps(report, default=handle_non_serializable))
    return {"step": model.step, "results": metrics(out["results"]),
            "lm_eval": {"version": lm_eval_version, "limit": limit, "num_fewshot": num_fewshot,
                        **report}}


def task_manager() -> Any:
    """lm-eval's index of its tasks, or the line saying how to install lm-eval."""
    try:
        from lm_eval.tasks import TaskManager
    except ModuleNotFoundError as e:
        missing = ("is not installed" if e.name in (None, "lm_eval")
                   else f"cannot be imported without {e.name}")
        raise UsageError(f"--harness evaluates with EleutherAI's lm-evaluation-harness (lm_eval),"
                         f" which {missing}: {INSTALL}") from None
    return TaskManager()


def check_tasks(manager: Any, tasks: list[str]) -> None:
    """A ``UsageError`` for the first of ``tasks`` that is neither a task (or group, or tag)
    lm-eval knows nor a task's YAML file, naming the closest names it knows."""
    known = manager.all_tasks
    for name in tasks:
        if name in manager.task_index or (name.endswith((".yaml", ".yml"))
                                           and Path(name).is_file()):
            continue
        close = difflib.get_close_matches(name, known, n=3, cutoff=0.75)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UsageError(f"--harness: lm-eval has no task {name!r}{hint} (lm-eval ls tasks "
                         f"lists them; a task's YAML file may be named by its path)")


def load_tasks(manager: Any, tasks: list[str]) -> None:
    """Build every task once before the job is restored, so that its data is fetched (or found
    in the datasets cache) and a task whose data cannot be read stops the command at once, in
    one line; the evaluation builds them again from the cache."""
    try:
        manager.load(list(tasks))
    except (ConnectionError, FileNotFoundError) as e:
        detail = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RunError(f"--harness: lm-eval cannot read the data of {', '.join(tasks)}: "
                       f"{detail} (nothing was evaluated)") from None


def metrics(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each task's metrics from lm-eval's results, whose keys are ``metric,filter``:
    ``acc,none`` as ``acc``, ``exact_match,strict-match`` as ``exact_match/strict-match``;
    what is no metric (an alias, a sample count) and an unknown standard error (``N/A``) left
    out."""
    out = {}
    for task, values in results.items():
        out[task] = {}
        for key, value in values.items():
            metric, comma, filtered = key.partition(",")
            if comma and isinstance(value, int | float) and not isinstance(value, bool):
                out[task][metric if filtered == "none" else f"{metric}/{filtered}"] = value
    return out


@contextlib.contextmanager
def _sequential_bootstrap() -> Iterator[None]:
    """lm-eval's bootstrapped standard errors in this process: its default forks a pool of
    processes, and a fork of a process where JAX runs threads can deadlock."""
    before = os.environ.get("DISABLE_MULTIPROC")
    os.environ["DISABLE_MULTIPROC"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["DISABLE_MULTIPROC"]
        else:
            os.environ["DISABLE_MULTIPROC"] = before
