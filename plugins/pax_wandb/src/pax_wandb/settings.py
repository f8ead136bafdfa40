"""The job's settings as a W&B run config, from the config text Pax hands its loggers.

That text is the job's ``config.txt``: a header of ``#`` lines (the experiment, each ``--set``
override, the software) and then one ``path = value`` line per leaf of the config tree, each
value as Python writes it. W&B's config takes numbers, strings, booleans, None and lists, so a
value Python can read back as one of those is that value, and any other (a class, a function)
stays as its text.
"""

from __future__ import annotations

import ast
from typing import Any

OVERRIDE = "# override: "


def _value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return text


def config_settings(text: str) -> dict[str, Any]:
    """``{"overrides": [...], "task.train.num_train_steps": 200, ...}`` from a config text."""
    overrides = [line.removeprefix(OVERRIDE) for line in text.splitlines()
                 if line.startswith(OVERRIDE)]
    settings: dict[str, Any] = {"overrides": overrides}
    for line in text.splitlines():
        path, found, value = line.partition(" = ")
        if found and not line.startswith("#"):
            settings[path] = _value(value)
    return settings
