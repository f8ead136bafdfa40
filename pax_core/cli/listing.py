"""``pax plugins``, ``pax experiments``, ``pax plan`` and ``pax config --constants``: tables
for people, tab-separated rows for pipes, JSON for scripts.

No cell is ever cut: a name that does not fit a terminal's table folds onto the next line, and
piped output (``pax experiments | grep NAME``) is one plain row per item, so a search finds the
whole name.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from pax_core import API_VERSION, __version__
from pax_core.errors import UsageError
from pax_core.loggers.console import format_value
from pax_core.plugins.host import PluginHost

_STATUS_STYLE = {"active": "green", "disabled": "yellow", "failed": "red",
                 "incompatible": "red"}


def output_format(chosen: str | None, as_json: bool) -> str:
    """The listing's format: ``--format``, ``--json`` (its older spelling), else a table on a
    terminal and tab-separated rows in a pipe."""
    if as_json:
        if chosen not in (None, "json"):
            raise UsageError(f"--json and --format {chosen} contradict each other; give one")
        return "json"
    if chosen is not None:
        return chosen
    return "table" if sys.stdout.isatty() else "tsv"


def _cell(text: str) -> str:
    """A table cell as one field of a tab-separated row."""
    return " ".join(text.replace("\t", " ").split("\n")).strip() or "-"


def print_rows(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], fmt: str, *,
               styles: Sequence[dict[int, str]] | None = None, show_header: bool = True,
               right: Sequence[int] = ()) -> None:
    """``rows`` as a rich table that wraps (``fmt`` "table"), or as tab-separated lines, a
    header line first ("tsv"). Cells are plain text; ``styles`` (one per row: column to rich
    style) colour them in a table, ``right`` are the columns aligned right there."""
    if fmt == "tsv":  # rich is imported for a table only: a pipe gets its rows sooner
        if show_header:
            print("\t".join(columns))
        for row in rows:
            print("\t".join(_cell(v) for v in row))
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=escape(title), show_header=show_header)
    for i, column in enumerate(columns):
        table.add_column(column, overflow="fold", justify="right" if i in right else "left")
    for n, row in enumerate(rows):
        style = styles[n] if styles else {}
        table.add_row(*(f"[{style[i]}]{escape(v)}[/{style[i]}]" if style.get(i) else escape(v)
                        for i, v in enumerate(row)))
    Console().print(table)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=1))


def show_plugins(host: PluginHost, fmt: str) -> None:
    records = list(host.records.values())
    conflicts = {
        kind: {name: [e.qualified_name for e in entries]
               for name, entries in host.components(kind).conflicts().items()}
        for kind in {k for r in records for k in r.registered}
    }
    conflicts = {k: v for k, v in conflicts.items() if v}
    if fmt == "json":
        _print_json({"pax_core": __version__, "api_version": API_VERSION,
                     "plugins": [r.as_json() for r in records], "conflicts": conflicts})
        return
    # A table shows a modality's long catalogue as a count and the first names; a pipe gets
    # every name, for grep.
    shown = 6 if fmt == "table" else None
    rows, styles = [], []
    for r in records:
        registered = "\n".join(_summary(kind, names, shown)
                               for kind, names in r.registered.items())
        status = r.status if not r.reason else f"{r.status}: {r.reason}"
        rows.append([r.name, r.distribution, r.version, r.api or "-", status,
                     "\n".join(h.removeprefix("pax_") for h in r.hooks) or "-",
                     registered or "-"])
        styles.append({4: _STATUS_STYLE.get(r.status, "")})
    print_rows(f"Pax plugins (pax-core {__version__}, plugin API {API_VERSION})",
               ("plugin", "distribution", "version", "API", "status", "hooks", "registered"),
               rows, fmt, styles=styles)
    for kind, names in conflicts.items():
        for name, owners in names.items():
            line = f"{kind[:-1]} '{name}' is registered by {', '.join(owners)}; " \
                   f"name it as plugin/{name}"
            if fmt == "table":
                from rich.console import Console
                from rich.markup import escape

                Console().print(escape(line), style="yellow")
            else:  # the rows stay rows, for whatever reads them
                print(f"pax: {line}", file=sys.stderr)


def _summary(kind: str, names: list[str], shown: int | None) -> str:
    """``kind: a, b, c``; with ``shown``, a long list (a modality's catalogue) is its first
    names and a count."""
    if shown is None or len(names) <= shown:
        return f"{kind}: {', '.join(names)}"
    return f"{kind} ({len(names)}): {', '.join(names[:shown])}, ..."


def show_experiments(host: PluginHost, plugin: str | None, fmt: str) -> None:
    if plugin:
        host.require(plugin)
    entries = [e for e in host.components("experiments") if plugin is None or e.plugin == plugin]
    if fmt == "json":
        _print_json([
            {"name": e.name, "plugin": e.plugin, "target": e.component.target,
             "aliases": list(getattr(e.component, "aliases", ())), "help": e.component.help}
            for e in entries
        ])
        return
    print_rows("Pax experiments", ("experiment", "plugin", "class", "description"),
               [(e.name, e.plugin, e.component.target, e.component.help or "") for e in entries],
               fmt)


def show_constants(name: str, experiment: type, fmt: str) -> None:
    """The UPPER_CASE constants of ``experiment`` that ``--set KEY=VALUE`` takes: each one's
    value (overrides applied) and the type a new value must have."""
    from pax_core.config.overrides import constant_types

    constants = experiment.constants()
    types = constant_types(experiment)
    if fmt == "json":
        _print_json({"experiment": name, "constants": [
            {"name": key, "value": _jsonable(value), "type": types[key]}
            for key, value in constants.items()]})
        return
    print_rows(f"Constants of {name} (--set NAME=VALUE)", ("constant", "value", "type"),
               [(key, repr(value), types[key]) for key, value in constants.items()], fmt)


def _jsonable(value: Any) -> Any:
    """``value`` itself where JSON holds it, else its Python spelling."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value


def _tera(flops: float | None) -> str:
    return "-" if flops is None else f"{flops / 1e12:,.1f}"


def show_plan(result, fmt: str) -> None:
    """One experiment's ``pax plan``: sizes, FLOPs and per-device memory."""
    if fmt == "json":
        _print_json(result.as_json())
        return
    mesh = " x ".join(f"{axis} {size}" for axis, size in result.mesh.items())
    rows = [
        ("devices (mesh)", f"{result.devices} ({mesh})"),
        ("parameters", f"{result.params:,}" if result.active_params == result.params
         else f"{result.params:,} ({result.active_params:,} active per token)"),
        ("tokens per step", "-" if result.tokens_per_step is None
         else f"{result.tokens_per_step:,}"),
        ("model TFLOP per step (analytic, "
         f"{result.flops_formula or 'no formula'})", _tera(result.model_flops_per_step)),
        ("model FLOP per token (analytic)", "-" if result.model_flops_per_token is None
         else f"{result.model_flops_per_token:,.0f}"),
        ("hardware TFLOP per step (XLA cost analysis, loops counted in full)",
         _tera(result.hardware_flops_per_step)),
        ("GiB per device: parameters", f"{result.params_gib:.2f}"),
        ("GiB per device: optimizer state", f"{result.opt_state_gib:.2f}"),
        ("GiB per device: temporaries (compiled)", f"{result.temporaries_gib:.2f}"),
        ("GiB per device: total", f"{result.total_gib:.2f}"),
        (f"fits {result.hbm_gib:g} GiB per device", "yes" if result.fits else "NO"),
        *((name.replace("_", " "), format_value(value) if isinstance(value, float) else str(value))
          for name, value in result.placement.items()),
        *(("preset", line) for line in result.presets),
    ]
    rows += _prediction_rows(result.prediction)
    print_rows(f"pax plan: {result.experiment}", ("what", "value"), rows, fmt,
               show_header=fmt == "tsv", right=(1,))
    if result.prediction is not None:
        print_rows(f"largest costs on {result.prediction.target} (per step)",
                   ("cost", "where", "runs", "time", "share"),
                   [(c["what"], c["where"], str(c["executions"]), _duration(c["seconds"]),
                     f"{c['share']:.0%}") for c in result.prediction.top_costs], fmt,
                   right=(2, 3, 4))


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:,.2f} s"
    return f"{seconds * 1e3:.3g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} µs"


def _prediction_rows(prediction) -> list[tuple[str, str]]:
    if prediction is None:
        return []
    return [
        (f"predicted on {prediction.target}: step time", _duration(prediction.step_seconds)),
        ("predicted tokens/s per chip", "-" if prediction.tokens_per_sec_per_chip is None
         else f"{prediction.tokens_per_sec_per_chip:,.0f}"),
        ("predicted MFU", "-" if prediction.mfu is None else f"{prediction.mfu:.1%}"),
        ("bottleneck", prediction.bottleneck),
        ("computation (roofline)", _duration(prediction.compute_seconds)),
        ("collectives (in all / not overlapped)",
         f"{_duration(prediction.collective_seconds)} / "
         f"{_duration(prediction.exposed_collective_seconds)}"),
        (f"fits {prediction.hbm_gib:g} GiB per chip", prediction.fits if prediction.fits != "unsure"
         else "unsure (the temporaries compiled for the CPU are an upper bound)"),
        ("overlap assumed", prediction.overlap),
    ]


def show_search(found, fmt: str) -> None:
    """``pax plan --search``: the candidates that fit, fastest first, with their commands."""
    if fmt == "json":
        _print_json(found.as_json())
        return
    rows = [(str(i + 1), c.mesh_text, c.varied or "-", _duration(c.prediction.step_seconds),
             f"{c.prediction.tokens_per_sec_per_chip or 0:,.0f}",
             "-" if c.prediction.mfu is None else f"{c.prediction.mfu:.1%}",
             f"{c.total_gib:.1f}", c.prediction.fits, c.prediction.bottleneck)
            for i, c in enumerate(found.ranked[:found.show])]
    print_rows(f"pax plan --search: {found.experiment} on {found.target} "
               f"({len(found.ranked)} of {found.tried} candidates fit)",
               ("rank", "mesh", "varied", "step", "tokens/s/chip", "MFU", "GiB/chip", "fits",
                "bottleneck"), rows, fmt, right=(0, 3, 4, 5, 6))
    if fmt == "table":
        for i, c in enumerate(found.ranked[:found.show]):
            print(f"{i + 1}: {c.command}")
        for reason, count in found.dropped.items():
            print(f"dropped {count}: {reason}")
