"""``pax plugins`` and ``pax experiments``: tables for people, JSON for scripts."""

from __future__ import annotations

import json

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pax_core import API_VERSION, __version__
from pax_core.loggers.console import format_value
from pax_core.plugins.host import PluginHost

_STATUS_STYLE = {"active": "green", "disabled": "yellow", "failed": "red",
                 "incompatible": "red"}


def show_plugins(host: PluginHost, as_json: bool) -> None:
    records = list(host.records.values())
    conflicts = {
        kind: {name: [e.qualified_name for e in entries]
               for name, entries in host.components(kind).conflicts().items()}
        for kind in {k for r in records for k in r.registered}
    }
    conflicts = {k: v for k, v in conflicts.items() if v}
    if as_json:
        print(json.dumps({"pax_core": __version__, "api_version": API_VERSION,
                          "plugins": [r.as_json() for r in records], "conflicts": conflicts},
                         indent=1))
        return
    table = Table(title=f"Pax plugins (pax-core {__version__}, plugin API {API_VERSION})")
    for column in ("plugin", "distribution", "version", "API", "status", "hooks", "registered"):
        table.add_column(column)
    for r in records:
        registered = "\n".join(_summary(kind, names) for kind, names in r.registered.items())
        hooks = "\n".join(h.removeprefix("pax_") for h in r.hooks)
        status = r.status if not r.reason else f"{r.status}: {r.reason}"
        style = _STATUS_STYLE.get(r.status, "")
        table.add_row(escape(r.name), escape(r.distribution), escape(r.version),
                      escape(r.api) or "-", f"[{style}]{escape(status)}[/{style}]",
                      escape(hooks) or "-", escape(registered) or "-")
    console = Console()
    console.print(table)
    for kind, names in conflicts.items():
        for name, owners in names.items():
            console.print(escape(f"{kind[:-1]} '{name}' is registered by {', '.join(owners)}; "
                                 f"name it as plugin/{name}"), style="yellow")


def _summary(kind: str, names: list[str], shown: int = 6) -> str:
    """``kind: a, b, c``; long lists (a modality's catalogue) are cut, with a count."""
    if len(names) <= shown:
        return f"{kind}: {', '.join(names)}"
    return f"{kind} ({len(names)}): {', '.join(names[:shown])}, ..."


def show_experiments(host: PluginHost, plugin: str | None, as_json: bool) -> None:
    if plugin:
        host.require(plugin)
    entries = [e for e in host.components("experiments") if plugin is None or e.plugin == plugin]
    if as_json:
        print(json.dumps([
            {"name": e.name, "plugin": e.plugin, "target": e.component.target,
             "aliases": list(getattr(e.component, "aliases", ())), "help": e.component.help}
            for e in entries
        ], indent=1))
        return
    table = Table(title="Pax experiments")
    for column in ("experiment", "plugin", "class", "description"):
        table.add_column(column)
    for e in entries:
        table.add_row(*(escape(v) for v in (e.name, e.plugin, e.component.target,
                                              e.component.help)))
    Console().print(table)


def _tera(flops: float | None) -> str:
    return "-" if flops is None else f"{flops / 1e12:,.1f}"


def show_plan(result, as_json: bool) -> None:
    """One experiment's ``pax plan``: sizes, FLOPs and per-device memory."""
    if as_json:
        print(json.dumps(result.as_json(), indent=1))
        return
    mesh = " x ".join(f"{axis} {size}" for axis, size in result.mesh.items())
    table = Table(title=f"pax plan: {escape(result.experiment)}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        ("devices (mesh)", f"{result.devices} ({mesh})"),
        ("parameters", f"{result.params:,}"),
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
    for what, value in rows:
        table.add_row(what, value)
    Console().print(table)
