"""What a sweep searches: PyGlove hyper-values over an experiment's constants and config paths,
the metric that judges a trial, and how many trials to spend.

An experiment declares its space in ``search()``; ``pax sweep --search KEY=EXPR`` adds to it or
replaces a key of it, in the same words as PyGlove: ``oneof([...])``, ``floatv(LOW, HIGH, log)``,
``intv(LOW, HIGH)`` (PyGlove spells it ``oneof(range(LOW, HIGH + 1))``) and
``manyof(K, [...])``. A key is what ``--set`` takes, so each trial is a job trained with the
chosen values as ``--set`` overrides.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyglove as pg

from pax_core import UsageError

GOALS = ("minimize", "maximize")
# An early-stopping gate judges a trial only once this many trials have reached its step.
MIN_REPORTED = 3

_FORMS = "oneof([A, B, ...]), floatv(LOW, HIGH[, log]), intv(LOW, HIGH) or manyof(K, [A, B, ...])"


@dataclasses.dataclass(frozen=True)
class SearchSpace:
    """A sweep's search space (``Experiment.search()`` returns one).

    ``values`` maps a ``--set`` key (``LEARNING_RATE``, ``task.model.num_layers``) to a PyGlove
    hyper-value (``pg.oneof``, ``pg.floatv``, ``pg.manyof``) or to a fixed value. ``metric`` is
    ``KIND NAME`` (or ``KIND/NAME``) as the job's metrics name it: ``eval/heldout log_pplx``,
    ``train loss``; the trial's value is its last one. ``goal`` is ``minimize`` or
    ``maximize``; ``max_trials`` is the budget when the command gives none. ``early_stop``
    holds ``(STEP, FRACTION)`` gates: a trial whose metric at STEP is not among the best
    FRACTION of the trials that reached STEP before it is stopped there (once
    ``MIN_REPORTED`` have).
    """

    values: Mapping[str, Any]
    metric: str = ""
    goal: str = "minimize"
    max_trials: int | None = None
    early_stop: tuple[tuple[int, float], ...] = ()

    def hyper(self) -> pg.Dict:
        """The space as one PyGlove value, keys in a stable order."""
        return pg.Dict({key: self.values[key] for key in sorted(self.values)})

    def describe(self) -> dict[str, str]:
        """Each key's hyper-value as text, for the sweep record and its listing."""
        return {key: _text(self.values[key]) for key in sorted(self.values)}


def _text(value: Any) -> str:
    """A hyper-value in ``--search``'s words (PyGlove's own format shows ``(32,)`` as ``(32)``)."""
    if isinstance(value, pg.hyper.Float):
        scale = f", {value.scale}" if value.scale else ""
        return f"floatv({value.min_value!r}, {value.max_value!r}{scale})"
    if isinstance(value, pg.hyper.ManyOf) and not isinstance(value, pg.hyper.OneOf):
        return f"manyof({value.num_choices}, {_plain(value.candidates)!r})"
    if isinstance(value, pg.hyper.OneOf):
        return f"oneof({_plain(value.candidates)!r})"
    return repr(value)


def metric_parts(metric: str) -> tuple[str, str]:
    """``eval/heldout log_pplx`` or ``eval/heldout/log_pplx`` → (``eval/heldout``,
    ``log_pplx``): the record kind and the metric's name in ``metrics.jsonl``."""
    text = metric.strip()
    cut = max(text.rfind(" "), text.rfind("/"))
    kind, name = text[:cut].strip(), text[cut + 1:].strip()
    if cut <= 0 or not kind or not name:
        raise UsageError(f"metric {metric!r}: expected KIND NAME as the job's metrics name "
                         f"it, such as 'eval/test loss' or 'train loss'")
    return kind, name


def _parse_value(key: str, text: str) -> Any:
    """One ``--search`` expression as a PyGlove hyper-value (or a fixed literal)."""
    where = f"--search {key}={text}"
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise UsageError(f"{where}: not an expression; write {_FORMS}") from None
    if not isinstance(node, ast.Call):
        try:
            return ast.literal_eval(node)
        except (ValueError, TypeError, SyntaxError):
            raise UsageError(f"{where}: write {_FORMS}, or a fixed Python literal") from None
    name = node.func.id if isinstance(node.func, ast.Name) else ""
    args = [_argument(where, a) for a in node.args]
    kwargs = {k.arg: _argument(where, k.value) for k in node.keywords}
    try:
        if name == "oneof" and len(args) == 1 and not kwargs:
            return pg.oneof(_candidates(where, args[0]))
        if name == "floatv" and len(args) in (2, 3):
            scale = args[2] if len(args) == 3 else kwargs.pop("scale", None)
            if kwargs or scale not in (None, "linear", "log"):
                raise UsageError(f"{where}: floatv takes LOW, HIGH and an optional scale, "
                                 f"log or linear")
            low, high = (float(a) for a in args[:2])
            if not low < high or (scale == "log" and low <= 0):
                raise UsageError(f"{where}: floatv needs LOW < HIGH (and LOW > 0 on a log "
                                 f"scale)")
            return pg.floatv(low, high, scale=None if scale == "linear" else scale)
        if name == "intv" and len(args) == 2 and not kwargs:
            low, high = args
            if not (isinstance(low, int) and isinstance(high, int) and low <= high):
                raise UsageError(f"{where}: intv needs two integers LOW <= HIGH")
            return pg.oneof(list(range(low, high + 1)))
        if name == "manyof" and len(args) == 2 and not kwargs:
            count, candidates = args[0], _candidates(where, args[1])
            if not (isinstance(count, int) and 0 < count <= len(candidates)):
                raise UsageError(f"{where}: manyof needs a count from 1 to the number of "
                                 f"candidates")
            return pg.manyof(count, candidates, sorted=True)  # a set: one order
    except (TypeError, ValueError) as e:
        raise UsageError(f"{where}: {e}") from None
    raise UsageError(f"{where}: write {_FORMS}")


def _argument(where: str, node: ast.expr) -> Any:
    if isinstance(node, ast.Name) and node.id in ("log", "linear"):
        return node.id
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        raise UsageError(f"{where}: {ast.unparse(node)!r} is not a Python literal") from None


def _candidates(where: str, value: Any) -> list[Any]:
    if not isinstance(value, list | tuple) or not value:
        raise UsageError(f"{where}: the candidates must be a non-empty list")
    return list(value)


def parse_search(items: list[str], files: list[str] = ()) -> dict[str, Any]:
    """``KEY=EXPR`` items from the command line and from files (one per line; blank lines and
    lines that start with ``#`` are skipped), as key → hyper-value; a later item replaces an
    earlier one of the same key."""
    lines = []
    for file in files:
        try:
            text = Path(file).read_text()
        except OSError as e:
            raise UsageError(f"--search-file {file}: {e.strerror or e}") from None
        lines += [ln.strip() for ln in text.splitlines() if not ln.strip().startswith("#")]
    out: dict[str, Any] = {}
    for item in [ln for ln in lines if ln] + list(items):
        key, sep, text = item.partition("=")
        if not sep or not key.strip() or not text.strip():
            raise UsageError(f"--search {item!r}: expected KEY=EXPR, e.g. --search "
                             f"'LEARNING_RATE=floatv(1e-4, 1e-1, log)'")
        out[key.strip()] = _parse_value(key.strip(), text)
    return out


def parse_early_stop(items: list[str]) -> tuple[tuple[int, float], ...]:
    """``--early-stop STEP:FRACTION`` items as gates, by step."""
    gates = []
    for item in items:
        step, sep, fraction = item.partition(":")
        try:
            gate = (int(step), float(fraction))
        except ValueError:
            gate = None
        if not sep or gate is None or gate[0] < 1 or not 0 < gate[1] < 1:
            raise UsageError(f"--early-stop {item}: expected STEP:FRACTION, a step above 0 "
                             f"and a fraction between 0 and 1, such as 200:0.5 (stop at step "
                             f"200 a trial outside the best half there)")
        gates.append(gate)
    return tuple(sorted(gates))


def combine(declared: SearchSpace | None, values: Mapping[str, Any], metric: str | None,
            goal: str | None, early_stop: tuple[tuple[int, float], ...] = ()) -> SearchSpace:
    """The experiment's space with the command line's keys, metric, goal and early-stopping
    gates over it."""
    base = declared or SearchSpace(values={})
    space = SearchSpace(values={**base.values, **values}, metric=metric or base.metric,
                        goal=goal or base.goal, max_trials=base.max_trials,
                        early_stop=early_stop or tuple(base.early_stop))
    if not any(isinstance(v, pg.hyper.HyperPrimitive) for v in space.values.values()):
        raise UsageError("the search space is empty: the experiment declares no search() and "
                         "no --search gives a choice; add --search 'KEY=oneof([...])'")
    if not space.metric:
        raise UsageError("no metric to optimise: the experiment's search() names none; give "
                         "--metric 'KIND NAME', such as --metric 'eval/test loss'")
    metric_parts(space.metric)
    if space.goal not in GOALS:
        raise UsageError(f"goal {space.goal!r}: use minimize or maximize")
    return space


def check_keys(space: SearchSpace, experiment: str, constants: Mapping[str, Any]) -> None:
    """Refuse a constant the experiment does not have (config paths are checked by the first
    trial, which builds the config)."""
    for key in space.values:
        if "." in key or "[" in key or key in constants:
            continue
        close = difflib.get_close_matches(key, list(constants), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise UsageError(f"search space: {key} is not a constant of experiment "
                         f"{experiment}{hint} (a config path has dots: task.model.…)")


def overrides(chosen: Mapping[str, Any]) -> list[str]:
    """A trial's chosen values as ``--set`` items."""
    return [f"{key}={_plain(value)!r}" for key, value in sorted(chosen.items())]


def _plain(value: Any) -> Any:
    """PyGlove's symbolic lists and dicts (what ``manyof`` and ``oneof`` of dicts give) as
    Python's, so that they read back as literals."""
    if isinstance(value, pg.List):
        return [_plain(v) for v in value]
    if isinstance(value, pg.Dict):
        return {k: _plain(v) for k, v in value.items()}
    return value
