"""``--set KEY=VALUE``: overriding experiment constants and paths of the built config.

``KEY`` is either an UPPER_CASE constant of the experiment (``NUM_LAYERS``), applied before
``task()`` runs so that everything derived from it follows, or a path into the resolved config
(``task.model.num_layers``, ``datasets[0].batch_size``). Values are Python literals checked
against the type of what they replace; a string field also takes a bare word. Every mistake is a
``UsageError`` that names the key and, for a typo, the closest valid names.
"""

from __future__ import annotations

import ast
import collections.abc
import dataclasses
import difflib
import inspect
import re
import types
import typing
from typing import Any

import fiddle as fdl

from pax_core.errors import UsageError

_PATH_PART = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)$")


@dataclasses.dataclass(frozen=True)
class Override:
    key: str
    text: str

    @property
    def is_constant(self) -> bool:
        return "." not in self.key and "[" not in self.key

    def __str__(self) -> str:
        return f"{self.key}={self.text}"


def parse(items: list[str]) -> list[Override]:
    """Split ``KEY=VALUE`` items (as typed after ``--set``)."""
    out = []
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set {item!r}: expected KEY=VALUE, e.g. --set NUM_LAYERS=4")
        out.append(Override(key.strip(), text.strip()))
    return out


def _did_you_mean(name: str, valid: list[str]) -> str:
    by_lower = {v.lower(): v for v in valid}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {by_lower[close[0]]}?"
    return f"; valid names: {', '.join(valid)}"


def _literal(text: str, key: str, accepts_str: bool) -> Any:
    """The value ``text`` spells; a bare word is kept as text where a string is accepted."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError):
        if accepts_str:
            return text
        raise UsageError(
            f"--set {key}={text}: {text!r} is not a Python literal (numbers, strings in quotes, "
            f"lists, tuples, True/False, None)"
        ) from None


def _conforms(value: Any, annotation: Any) -> bool:
    """Whether ``value`` fits ``annotation``; unknown annotations accept anything."""
    if annotation is Any or annotation is inspect.Parameter.empty:
        return True
    if annotation is type(None):
        return value is None
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in typing.get_args(annotation))
    if origin in (list, tuple, collections.abc.Sequence) or annotation in (list, tuple):
        if not isinstance(value, list | tuple):
            return False
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return all(_conforms(v, args[0]) for v in value) if len(args) == 1 else True
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(annotation, type):
        return isinstance(value, annotation)
    return True


def _like(value: Any, current: Any) -> Any:
    """Give ``value`` the container and number type of the value it replaces."""
    if isinstance(current, tuple) and isinstance(value, list):
        return tuple(value)
    if isinstance(current, list) and isinstance(value, tuple):
        return list(value)
    if isinstance(current, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _annotation_of_current(current: Any) -> Any:
    if current is None:
        return Any
    if isinstance(current, list | tuple):
        return list | tuple
    if isinstance(current, float):
        return float
    return type(current)


def _typed_value(ov: Override, current: Any, annotation: Any = Any) -> Any:
    if isinstance(current, fdl.Buildable):
        raise UsageError(
            f"--set {ov}: {ov.key} is a configured {fdl.get_callable(current).__name__}; "
            f"set its fields instead ({ov.key}.<field>=...)"
        )
    expected = annotation if annotation is not Any else _annotation_of_current(current)
    if expected is str and ov.text[:1] not in ("'", '"'):
        value: Any = ov.text
    else:
        value = _literal(ov.text, ov.key, accepts_str=_conforms("", expected))
    if not _conforms(value, expected):
        want = getattr(expected, "__name__", str(expected))
        raise UsageError(
            f"--set {ov}: {ov.key} expects {want}, got {type(value).__name__} {value!r}"
        )
    return _like(value, current)


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # an annotation naming what the experiment's module does not import
        return {}


def _type_name(annotation: Any) -> str:
    if annotation is Any:
        return "any"
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def constant_types(cls: type) -> dict[str, str]:
    """The type a ``--set`` value of each constant of experiment ``cls`` must have: its
    annotation, else the type of its value (what ``apply_constants`` checks against)."""
    hints = _hints(cls)
    return {key: _type_name(hints[key] if hints.get(key, Any) is not Any
                            else _annotation_of_current(value))
            for key, value in cls.constants().items()}


def apply_constants(cls: type, overrides: list[Override]) -> type:
    """A subclass of experiment ``cls`` with the constants replaced."""
    constants = cls.constants()
    hints = _hints(cls)
    attrs: dict[str, Any] = {}
    aliases = cls.aliases()
    for ov in overrides:
        key = aliases.get(ov.key, ov.key)
        if key not in constants:
            raise UsageError(
                f"--set {ov}: unknown field {ov.key} of experiment {cls.__name__}"
                + _did_you_mean(ov.key, sorted(constants))
            )
        attrs[key] = _typed_value(ov, constants[key], hints.get(key, Any))
    if not attrs:
        return cls
    return type(cls.__name__, (cls,), {**attrs, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})


def _parameters(cfg: fdl.Buildable) -> dict[str, Any]:
    """Parameter name → annotation of what ``cfg`` configures."""
    fn = fdl.get_callable(cfg)
    try:
        hints = typing.get_type_hints(fn.__init__ if isinstance(fn, type) else fn)
    except Exception:
        hints = {}
    skip = {"parent", "name"} if _is_flax_module(fn) else set()
    return {
        name: hints.get(name, Any)
        for name, p in cfg.__signature_info__.signature.parameters.items()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and name not in skip
    }


def _is_flax_module(fn: Any) -> bool:
    try:
        import flax.linen as nn

        return isinstance(fn, type) and issubclass(fn, nn.Module)
    except ImportError:
        return False


def _field(node: fdl.Buildable, name: str) -> Any:
    """``node.name`` as the build will see it; None for a parameter that has no value yet.

    Fiddle cannot read a dataclass field left to its ``default_factory``: when the factory is a
    dataclass the field becomes a config of it, so that a path can go through it; otherwise it
    reads as what the factory makes.
    """
    try:
        return getattr(node, name)
    except AttributeError:
        return None
    except ValueError:
        fields = {f.name: f for f in dataclasses.fields(fdl.get_callable(node))}
        factory = fields[name].default_factory
        if not (isinstance(factory, type) and dataclasses.is_dataclass(factory)):
            return factory()
        setattr(node, name, fdl.Config(factory))
        return getattr(node, name)


def _step(node: Any, part: str, walked: str, ov: Override) -> Any:
    if isinstance(node, fdl.Buildable):
        params = _parameters(node)
        if part not in params:
            what = fdl.get_callable(node).__name__
            raise UsageError(
                f"--set {ov}: unknown field {part} of {walked} ({what})"
                + _did_you_mean(part, sorted(params))
            )
        return _field(node, part)
    if hasattr(node, "__dict__") and not isinstance(node, list | tuple | dict):
        if not hasattr(node, part):
            raise UsageError(f"--set {ov}: {walked} has no field {part}")
        return getattr(node, part)
    raise UsageError(f"--set {ov}: {walked} is a {type(node).__name__}, it has no field {part}")


def _index(node: Any, i: int, walked: str, ov: Override) -> Any:
    if not isinstance(node, list | tuple):
        raise UsageError(f"--set {ov}: {walked} is not a list")
    if i >= len(node):
        raise UsageError(f"--set {ov}: {walked} has {len(node)} entries; [{i}] is out of range")
    return node[i]


def apply_path(root: fdl.Buildable, ov: Override) -> None:
    """Set one ``a.b[0].c=VALUE`` override on the config ``root`` in place."""
    parts = ov.key.split(".")
    parsed = [_PATH_PART.match(p) for p in parts]
    if not all(parsed):
        raise UsageError(f"--set {ov}: {ov.key!r} is not a valid path (e.g. task.model.num_layers)")
    node, walked = root, ""
    *parents, last = parsed
    for m in parents:
        node = _step(node, m.group(1), walked or "the config", ov)
        walked = f"{walked}.{m.group(1)}" if walked else m.group(1)
        for i in re.findall(r"\[(\d+)\]", m.group(2)):
            node = _index(node, int(i), walked, ov)
            walked += f"[{i}]"
    name, indexes = last.group(1), re.findall(r"\[(\d+)\]", last.group(2))
    if indexes:
        raise UsageError(f"--set {ov}: set a whole list, not one entry ({name}=[...])")
    current = _step(node, name, walked or "the config", ov)
    if not isinstance(node, fdl.Buildable):
        raise UsageError(f"--set {ov}: {walked} is a built value, not a config")
    setattr(node, name, _typed_value(ov, current, _parameters(node)[name]))

