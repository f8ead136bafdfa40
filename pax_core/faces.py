"""A package's public face: the names other packages and users import from it, each imported
from its module on first use (PEP 562), so that importing the package (which ``pax plugins``
does, through its plugin module) imports neither JAX nor anything else heavy."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def public_face(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``, whose public names are ``exports`` (name ->
    the module that defines it): ``__getattr__ = public_face(__name__, EXPORTS)``."""

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(exports[name]), name)

    return __getattr__
