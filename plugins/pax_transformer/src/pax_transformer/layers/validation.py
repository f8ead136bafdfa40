"""Configuration checks shared by the layers and the model; messages list what is valid."""

from __future__ import annotations

from collections.abc import Iterable


def check_choice(field: str, value: object, valid: Iterable[object]) -> None:
    """Raise ValueError unless ``value`` is one of ``valid``, naming the field and the options."""
    options = list(valid)
    if value not in options:
        listed = ", ".join(repr(v) for v in options)
        raise ValueError(f"{field}={value!r} is not supported; valid values: {listed}")
