"""Which plugins fit this core: the API range a plugin declares against ``API_VERSION``.

A plugin module declares ``PAX_API = ">=1.0,<2"`` (a PEP 440 specifier over
``pax_core.API_VERSION``). A plugin outside its range is refused before any of its hooks run,
and ``pax plugins`` shows it as incompatible with both versions. A plugin that declares nothing
is taken as it is: the range is how a published plugin protects its users, not a gate on
throwaway plugins in tests. The versions of the libraries a run depends on are read here too:
a run records them, and the processes of a multi-process run compare them.
"""

from __future__ import annotations

import importlib.metadata
import operator
import re

from pax_core import API_VERSION

LIBRARIES = ("pax-core", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "fiddle")


class IncompatiblePlugin(Exception):
    """The plugin was built for another range of the plugin API."""


def declared_range(plugin: object) -> str:
    """The plugin's ``PAX_API``, or "" when it declares none."""
    value = getattr(plugin, "PAX_API", "")
    if not isinstance(value, str):
        raise TypeError(f"PAX_API must be a version specifier string such as '>=1.0,<2', "
                        f"got {value!r}")
    return value


_CLAUSE = re.compile(r"\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*")
_COMPARE = {">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
            ">": operator.gt, "<": operator.lt}


def _release(text: str, length: int) -> tuple[int, ...]:
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (length - len(parts)))


def _plain_range_contains(declared: str, version: str) -> bool | None:
    """Whether release ``version`` is in ``declared`` when each of its clauses compares with a
    release number (``>=1.16,<2``: every plugin's range), which is PEP 440's comparison of the
    releases padded with zeros; None for any other specifier. Saves ``pax --help`` importing
    ``packaging``, a tenth of its time."""
    clauses = [_CLAUSE.fullmatch(c) for c in declared.split(",")]
    if not all(clauses):
        return None
    length = max(len(c[2].split(".")) for c in clauses)
    length = max(length, len(version.split(".")))
    return all(_COMPARE[c[1]](_release(version, length), _release(c[2], length))
               for c in clauses)


def check_compatible(declared: str) -> None:
    """Refuse a declared range that does not contain ``API_VERSION`` ("" accepts any)."""
    if not declared:
        return
    inside = _plain_range_contains(declared, API_VERSION)
    if inside is None:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import Version

        try:
            inside = Version(API_VERSION) in SpecifierSet(declared)
        except InvalidSpecifier:
            raise TypeError(f"PAX_API {declared!r} is not a version specifier such as "
                            f"'>=1.0,<2'") from None
    if not inside:
        raise IncompatiblePlugin(f"built for pax API {declared}, but this pax-core provides "
                                 f"API {API_VERSION}")


def library_versions() -> dict[str, str]:
    """The installed version of each of ``LIBRARIES`` ("not installed" for one that is not)."""
    out = {}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out
