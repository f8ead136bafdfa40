"""The job's settings as MLflow params, and the names MLflow takes.

The settings come from the config text Pax hands its loggers (the job's ``config.txt``): a header
of ``#`` lines (the experiment, each ``--set`` override, the software) and then one
``path = value`` line per leaf of the config tree, each value as Python writes it.

MLflow params are strings with limits of their own: a name of letters, digits and ``_ - . / :``
and spaces, at most 250 characters; a value of at most 6,000 characters (MLflow's server
refuses a longer one). A config path's indices become path parts
(``datasets[0].name`` is ``datasets.0.name``), any other character a ``_``; a longer value is
cut, ending in ``...``, since the whole of it is in the job's ``config.txt``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

NAME_LIMIT = 250
VALUE_LIMIT = 6000
CUT = "..."
OVERRIDE = "# override: "
_INDEX = re.compile(r"\[(\d+)\]")
_NOT_IN_A_NAME = re.compile(r"[^\w\-./: ]")


def mlflow_name(name: str) -> str:
    """``name`` as MLflow takes a param or metric name."""
    return _NOT_IN_A_NAME.sub("_", _INDEX.sub(r".\1", name))[:NAME_LIMIT]


def mlflow_value(value: Any) -> str:
    """``value`` as MLflow takes a param value: its text, cut to the limit."""
    text = str(value)
    return text if len(text) <= VALUE_LIMIT else text[:VALUE_LIMIT - len(CUT)] + CUT


def _text(value: str) -> str:
    """A config value's text, a string's without its quotes."""
    try:
        read = ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return value
    return read if isinstance(read, str) else value


def config_params(text: str) -> dict[str, str]:
    """``{"overrides": "A=1; B=2", "task.train.num_train_steps": "200", ...}`` from a config
    text, ready for MLflow."""
    overrides = [line.removeprefix(OVERRIDE) for line in text.splitlines()
                 if line.startswith(OVERRIDE)]
    settings = {"overrides": "; ".join(overrides)} if overrides else {}
    for line in text.splitlines():
        path, found, value = line.partition(" = ")
        if found and not line.startswith("#"):
            settings[path] = _text(value)
    return as_params(settings)


def as_params(settings: Mapping[str, Any]) -> dict[str, str]:
    """Settings by MLflow's names, their values as MLflow's text."""
    return {mlflow_name(name): mlflow_value(value) for name, value in settings.items()}
