"""The experiment base class, shaped like Pax's.

An experiment is a class with UPPER_CASE constants, a ``task()`` that returns an ``fdl.Config``
of ``pax_core.config.task.Task``, and a ``datasets()`` that returns input configs (one with
``is_training=True``; the others are evaluated). The mesh is declared on the class. Constants are
the knobs: ``--set NUM_LAYERS=4`` makes a subclass with the new value before ``task()`` runs.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pax_core import axes


class Experiment:
    """Base of every experiment.

    ``ICI_MESH_SHAPE`` / ``DCN_MESH_SHAPE`` / ``MESH_AXIS_NAMES`` declare the device mesh (Pax's
    conventions; ``ICI_MESH_SHAPE = None`` is Pax's data-parallel path). ``PARTITIONER`` names
    the partitioner (None: ``spmd`` when a mesh is declared, else ``data_parallel``, as in Pax);
    ``MESH_LAYOUT`` the mesh layout that places devices in the mesh (None: for a mesh with DCN
    axes the one a plugin registers, such as pax-multislice's, else the built-in ``contiguous``);
    ``CHECKPOINTER`` and ``LOGGERS`` name registered components. ``LOGICAL_AXIS_RULES`` maps the
    model's logical axis names to mesh axes for the SPMD partitioner (None: Pax's canonical
    sharding, ``pax_core.axes.DEFAULT_RULES``). ``REQUIRED_PLUGINS`` names
    distributions the experiment cannot run without (checked before anything is built).
    """

    ICI_MESH_SHAPE: list[int] | None = None
    DCN_MESH_SHAPE: list[int] | None = None
    MESH_AXIS_NAMES: tuple[str, ...] = axes.MESH
    LOGICAL_AXIS_RULES: tuple[tuple[str, Any], ...] | None = None
    PARTITIONER: str | None = None
    MESH_LAYOUT: str | None = None
    CHECKPOINTER: str = "orbax"
    LOGGERS: tuple[str, ...] = ("console", "jsonl", "tensorboard")
    REQUIRED_PLUGINS: tuple[str, ...] = ()
    # Other names a constant answers to, in ``--set`` and in a subclass's body: Pax's spelling
    # of it, or the name an earlier release gave it (old name -> constant).
    constant_aliases: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        aliases = cls.aliases()
        for old in [name for name in vars(cls) if name in aliases]:
            setattr(cls, aliases[old], vars(cls)[old])
            delattr(cls, old)

    @classmethod
    def aliases(cls) -> dict[str, str]:
        """Every alias of a constant, from this class and its bases."""
        found: dict[str, str] = {}
        for klass in reversed(cls.__mro__):
            found.update(vars(klass).get("constant_aliases", {}))
        return found

    def task(self) -> Any:
        """Return ``fdl.Config(pax_core.config.task.Task, model=..., train=...)``."""
        raise NotImplementedError(f"{type(self).__name__} must define task()")

    def datasets(self) -> list[Any]:
        """Return input configs; exactly one must have ``is_training=True``."""
        raise NotImplementedError(f"{type(self).__name__} must define datasets()")

    def search(self) -> Any:
        """The search space ``pax sweep`` (pax-sweep) explores by default: a
        ``pax_sweep.SearchSpace`` of PyGlove hyper-values over constants and config paths, with
        the metric to optimise; None (the default) declares none, and ``pax sweep --search``
        must give one. Import pax-sweep inside this method: only a sweep calls it."""
        return None

    @classmethod
    def mesh_size(cls) -> int | None:
        """Devices of the declared ICI x DCN mesh; None when no mesh is declared."""
        if cls.ICI_MESH_SHAPE is None:
            return None
        return math.prod(cls.ICI_MESH_SHAPE) * math.prod(cls.DCN_MESH_SHAPE or [1])

    @classmethod
    def constants(cls) -> dict[str, Any]:
        """Every UPPER_CASE class attribute, including inherited ones."""
        out: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                if name.isupper() and not name.startswith("_") and not callable(value):
                    out[name] = value
        return out
