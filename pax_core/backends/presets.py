"""Named runtime presets: the environment variables and XLA (or libtpu) flags a backend or a mesh
layout recommends, applied before JAX starts.

Why named groups rather than one flag string: a user who finds one group harmful on their
cluster (a scheduler flag, a collective threshold) turns that group off by name
(``PAX_NO_PRESETS=gpu.nccl``) and keeps the rest; and the start record says which group set
what. The user's own values always win: an environment variable already set, or a flag already
in ``XLA_FLAGS`` / ``LIBTPU_INIT_ARGS``, is kept and recorded as theirs.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Mapping, MutableMapping, Sequence

from pax_core.errors import UsageError

# Comma-separated preset names (``gpu.nccl``), owners (``gpu``: all of that backend's), or
# ``all``: the presets not to apply.
DISABLE_VAR = "PAX_NO_PRESETS"


@dataclasses.dataclass(frozen=True)
class Preset:
    """One named group of settings.

    ``env`` maps environment variables to values; ``flags`` maps flag names (with their leading
    ``--``) to values, merged into the variable ``flags_var`` (``XLA_FLAGS`` for XLA, or
    ``LIBTPU_INIT_ARGS`` for the TPU runtime).
    """

    name: str
    description: str
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    flags: Mapping[str, str] = dataclasses.field(default_factory=dict)
    flags_var: str = "XLA_FLAGS"


@dataclasses.dataclass(frozen=True)
class Setting:
    """One value a preset set, or would have set where the user's own value was kept."""

    preset: str  # owner.name, e.g. gpu.latency-hiding
    variable: str  # the environment variable: XLA_FLAGS, NCCL_..., MEGASCALE_...
    name: str  # the flag, or the variable itself for a plain variable
    value: str  # the value in force
    source: str  # "preset", or "yours" when the user's value was kept

    def as_text(self) -> str:
        what = self.name if self.name == self.variable else f"{self.variable} {self.name}"
        kept = " (yours, kept)" if self.source == "yours" else ""
        return f"{self.preset}: {what}={self.value}{kept}"


def parse_flags(text: str) -> dict[str, str]:
    """``"--a=1 --b"`` as ``{"--a": "1", "--b": ""}``, in order; later repeats win, as in XLA."""
    flags: dict[str, str] = {}
    for token in shlex.split(text or ""):
        name, _, value = token.partition("=")
        flags[name] = value
    return flags


def format_flags(flags: Mapping[str, str]) -> str:
    return " ".join(f"{name}={value}" if value else name for name, value in flags.items())


def _disabled(environ: Mapping[str, str]) -> set[str]:
    return {part.strip() for part in environ.get(DISABLE_VAR, "").split(",") if part.strip()}


def apply_presets(owner: str, presets: Sequence[Preset],
                  environ: MutableMapping[str, str] | None = None) -> list[Setting]:
    """Set ``presets`` (of the backend or layout ``owner``) in ``environ`` (the process's
    environment by default), keeping every value the user set; returns what is in force."""
    environ = os.environ if environ is None else environ
    off = _disabled(environ)
    settings: list[Setting] = []
    for preset in presets:
        label = f"{owner}.{preset.name}"
        if {"all", owner, label} & off:
            continue
        for variable, value in preset.env.items():
            mine = variable in environ
            if not mine:
                environ[variable] = value
            settings.append(Setting(label, variable, variable, environ[variable],
                                    "yours" if mine else "preset"))
        if preset.flags:
            current = parse_flags(environ.get(preset.flags_var, ""))
            for name, value in preset.flags.items():
                mine = name in current
                if not mine:
                    current[name] = value
                settings.append(Setting(label, preset.flags_var, name, current[name],
                                        "yours" if mine else "preset"))
            environ[preset.flags_var] = format_flags(current)
    return settings


def check_names(known: Sequence[str], environ: Mapping[str, str] | None = None) -> None:
    """Refuse a ``PAX_NO_PRESETS`` entry that names no preset or owner of this run: a typo
    there would otherwise leave on what the user meant to turn off."""
    environ = os.environ if environ is None else environ
    owners = {name.partition(".")[0] for name in known}
    unknown = sorted(_disabled(environ) - {"all", *known, *owners})
    if unknown:
        raise UsageError(f"{DISABLE_VAR} names {unknown[0]!r}, which is no preset here; the "
                         f"presets are {', '.join(sorted(known)) or 'none'} (or 'all', or a "
                         f"backend's name for all of its own)")

