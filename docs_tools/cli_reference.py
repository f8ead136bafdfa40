"""The command-line reference page, written from the ``pax`` app itself.

The app is built as ``pax`` builds it (``pax_core.cli.app.build_app``) over the installed plugins,
and every command a plugin contributes is loaded and shaped as ``pax`` runs it
(``pax_core.cli.app.as_command``), so the page shows each command's usage, help and options as
``pax COMMAND --help`` would, and cannot drift from them.

Only the repository's user-facing packages are documented: a command of a plugin whose package
lies under ``tests/`` (the test plugin) is left out, and each command that one of Pax's packages
adds (``PACKAGED_COMMANDS``) must be there, so a build without it fails naming what to install.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable

import click
import typer

from pax_core.cli import app as app_module
from pax_core.cli.options import context_settings
from pax_core.plugins.host import PluginHost

# Characters Markdown would read as markup in help text, outside its `code` spans: escaped with
# a backslash, or written as HTML entities where Markdown has no escape for them.
_MARKUP = re.compile(r"([\\*_\[\]|])")
_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_CODE = re.compile(r"(`+).+?\1")  # a code span, between runs of as many backquotes


class MissingCommand(Exception):
    """A command of Pax's own packages that this environment lacks."""


def escaped(text: str) -> str:
    """``text`` as Markdown shows it literally, its backquoted spans kept as code."""
    parts, end = [], 0
    for span in _CODE.finditer(text):
        parts += [_literal(text[end:span.start()]), span.group(0)]
        end = span.end()
    return "".join([*parts, _literal(text[end:])])


def _literal(text: str) -> str:
    escaped = _MARKUP.sub(r"\\\1", text)
    return "".join(_ENTITIES.get(c, c) for c in escaped)


def _paragraphs(help_text: str | None) -> list[str]:
    """A command's help as click shows it: paragraphs separated by blank lines, each rewrapped
    onto one line."""
    return [escaped(" ".join(block.split()))
            for block in inspect.cleandoc(help_text or "").split("\n\n") if block.strip()]


def _options_table(command: click.Command, ctx: click.Context) -> list[str]:
    rows = [record for param in command.get_params(ctx)
            if (record := param.get_help_record(ctx)) is not None]
    if not rows:
        return []
    lines = ["| Option | Description |", "| --- | --- |"]
    for names, help_text in rows:
        lines.append(f"| `{names}` | {escaped(' '.join(help_text.split())) or ' '} |")
    return lines


def _section(command: click.Command, ctx: click.Context, level: int,
             origin: str | None) -> list[str]:
    """The heading, usage, help and options of ``command``, then of each of its subcommands."""
    path = ctx.command_path
    lines = [f"{'#' * level} {path}", ""]
    if origin:
        lines += [f"*From {origin}.*", ""]
    usage = " ".join([path, *command.collect_usage_pieces(ctx)])
    lines += ["```text", usage, "```", ""]
    for paragraph in _paragraphs(command.help):
        lines += [paragraph, ""]
    table = _options_table(command, ctx)
    if table:
        lines += [*table, ""]
    if isinstance(command, click.Group):
        subcommands = [(name, command.get_command(ctx, name))
                       for name in command.list_commands(ctx)]
        subcommands = [(name, sub) for name, sub in subcommands if not sub.hidden]
        if subcommands:
            lines += ["| Command | Description |", "| --- | --- |"]
            lines += [f"| [{name}](#{_anchor(f'{path} {name}')}) | "
                      f"{escaped(sub.get_short_help_str(limit=1000))} |"
                      for name, sub in subcommands]
            lines.append("")
        for name, sub in subcommands:
            sub_ctx = click.Context(sub, info_name=name, parent=ctx)
            lines += _section(sub, sub_ctx, min(level + 1, 6), None)
    return lines


def _anchor(title: str) -> str:
    """The id Python-Markdown's toc gives a heading: lower case, spaces as ``-``."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", title).strip().lower())


def _user_facing(host: PluginHost, test_modules: Iterable[str]) -> dict[str, str]:
    """Plugin command name -> the distribution that adds it, leaving out test plugins'."""
    hidden = set(test_modules)
    found = {}
    for entry in host.components("commands"):
        record = host.records[entry.plugin]
        if record.module.split(".")[0] not in hidden:
            found[entry.name] = record.distribution
    return found


def render(host: PluginHost, test_modules: Iterable[str] = ()) -> str:
    """The page: ``pax`` and its options, then every visible command in ``pax --help``'s
    order, a plugin's loaded from its registration, each with its subcommands."""
    plugin_commands = _user_facing(host, test_modules)
    missing = {name: package for name, package in app_module.PACKAGED_COMMANDS.items()
               if name not in plugin_commands}
    if missing:
        raise MissingCommand(
            "the command-line reference documents every command of Pax's packages, and these "
            "are not installed here: " + ", ".join(f"pax {n} ({p})" for n, p in missing.items())
            + f"; install them (pip install {' '.join(sorted(set(missing.values())))})")
    root = typer.main.get_command(app_module.build_app(host))
    ctx = click.Context(root, info_name="pax", obj=host,
                        help_option_names=context_settings()["help_option_names"])
    lines = ["# Command line", "",
             "Every `pax` command with its options, as `pax COMMAND --help` prints them; "
             "generated from the command-line application when this site was built. Commands "
             "marked *From* come with the plugin package named there.", ""]
    usage = " ".join(["pax", *root.collect_usage_pieces(ctx)])
    lines += ["## pax", "", "```text", usage, "```", ""]
    for paragraph in _paragraphs(root.help):
        lines += [paragraph, ""]
    lines += [*_options_table(root, ctx), ""]
    names = [n for n in root.list_commands(ctx) if not root.get_command(ctx, n).hidden]
    names = [n for n in names if n in app_module.BUILTIN or n == "plugins"
             or n in plugin_commands]
    lines += ["| Command | Description |", "| --- | --- |"]
    for name in names:
        lines.append(f"| [{name}](#{_anchor(f'pax {name}')}) | "
                     f"{escaped(root.get_command(ctx, name).get_short_help_str(limit=1000))} |")
    lines.append("")
    for name in names:
        command = root.get_command(ctx, name)
        origin = plugin_commands.get(name)
        if origin is not None:  # the stand-in: load the plugin's own command
            command = app_module.as_command(host.components("commands").get(name).load())
        sub_ctx = click.Context(command, info_name=name, parent=ctx)
        lines += _section(command, sub_ctx, 2, origin)
    return "\n".join(lines).rstrip() + "\n"
