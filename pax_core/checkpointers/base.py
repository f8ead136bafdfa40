"""Checkpoints: the interface the loop uses.

A checkpoint holds the train state and the training input's position, so that running the same
command again continues with the next batch. A checkpointer must never leave a half-written
step behind: the built-in one is ``pax_core.checkpointers.orbax``.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable
from typing import Any

import jax

from pax_core.errors import UsageError


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    """When to save and what to keep: every ``save_interval_steps``, the newest ``max_to_keep``
    steps, and besides them one every ``keep_interval_steps`` steps and one every
    ``keep_interval_seconds`` (0: none).

    ``read_only`` is for the commands that read a job (``pax eval``, ``pax export``, a
    modality's ``pax decode``), which may run while ``pax train`` is still writing it: such a
    checkpointer only restores, and changes nothing under its directory (no save, no clean-up
    of an unfinished save, which may be the one in progress, no step set aside)."""

    save_interval_steps: int
    max_to_keep: int
    async_save: bool = True
    keep_interval_steps: int = 0
    keep_interval_seconds: float = 0.0
    read_only: bool = False


@dataclasses.dataclass
class Weights:
    """What a weights-only step holds (written by ``pax import``): a model's parameters and
    its state, without optimizer state, step or RNG key. A run restoring one starts its
    optimizer afresh on them, at step 0. The step may lack parameters the model has (the
    adapters added to an imported model): ``params`` holds those it has, and the run decides
    about the rest (``task.train.init_from_ignore``: they start fresh)."""

    params: Any
    model_state: Any = dataclasses.field(default_factory=dict)


def place(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    """Put ``value`` at the key path ``path`` of the nested dicts ``tree``, making the dicts on
    the way."""
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


class StepRemoved(Exception):
    """A step that disappeared while it was being read: a reader of a job that is still
    training, whose checkpointer dropped the step (``max_to_keep``). The reader lists the steps
    again."""


class Checkpointer(abc.ABC):
    """Saves and restores ``(state, input_state)`` pairs by step."""

    def __init__(self, directory: str, settings: CheckpointSettings):
        self.directory = directory
        self.settings = settings

    def should_save(self, step: int) -> bool:
        """Whether ``step`` is on the save interval (the loop also saves the last step)."""
        return step % self.settings.save_interval_steps == 0

    @abc.abstractmethod
    def latest_step(self) -> int | None:
        """The newest complete step, or None."""

    def all_steps(self) -> list[int]:
        """Every complete step, oldest first (a restore falls back through them)."""
        latest = self.latest_step()
        return [] if latest is None else [latest]

    def set_aside(self, step: int, why: str = "damaged") -> str | None:
        """Move ``step`` out of the way, so that it is neither restored nor in the way of a later
        save: a damaged step, or (``why="rolled_back"``) one after the step a run is restarted
        from. Returns where it went, or None for a checkpointer that cannot (the run then stops
        at a damaged step, and cannot roll back)."""
        return None

    @abc.abstractmethod
    def save(self, step: int, state: Any, input_state: dict[str, Any]) -> bool:
        """Start saving ``step`` (a step already saved is skipped); returns whether it started.

        Saves may complete in the background; starting a save waits for the previous one, so
        once ``save`` returns every earlier step is committed.
        """

    def save_weights(self, step: int, tensors: Iterable[tuple[tuple[str, ...], Any]]) -> None:
        """Save a weights-only step (``Weights``: ``pax import``) from parameters arriving one
        at a time as ``(key path, host array)``, and wait until it is committed. This one
        gathers them and saves them together; a checkpointer that can write a step piecewise
        (Orbax) holds one at a time."""
        params: dict[str, Any] = {}
        for path, array in tensors:
            place(params, path, array)
        self.save(step, Weights(params), {})
        self.wait()

    @abc.abstractmethod
    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any] | None]:
        """Restore ``step`` onto the shardings of ``abstract_state`` (``ShapeDtypeStruct``s with
        ``sharding``), which may differ from those it was saved with. Parameters whose shapes
        differ from the checkpoint's are a ``UsageError`` naming the first one; a step whose
        files are damaged or do not read is a ``DamagedCheckpoint`` saying what is wrong.

        A step saved from ``Weights`` (``save(step, Weights(...), {})``) restores as
        ``Weights``, with no input position; a checkpointer that cannot save them raises
        ``UsageError`` in ``save``."""

    def check(self) -> None:
        """Raise the failure of a background save that has ended, without waiting for one still
        running; the loop calls it after every step, so a failed save stops the run at once
        rather than at the next save. A checkpointer that saves synchronously has nothing to
        check."""

    @abc.abstractmethod
    def wait(self) -> None:
        """Block until every started save is committed."""

    def close(self) -> None:
        self.wait()


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): tuple(leaf.shape) for path, leaf in leaves}


def check_params_match(step: int, saved: Any, expected: Any, absent_ok: bool = False) -> None:
    """Refuse a restore whose parameters differ from the configured model's (``absent_ok``: a
    weights-only step may lack some, ``Weights``)."""
    saved_shapes, expected_shapes = _shapes(saved), _shapes(expected)
    for path in sorted(set(saved_shapes) | set(expected_shapes)):
        have, want = saved_shapes.get(path), expected_shapes.get(path)
        if have != want and not (absent_ok and have is None):
            raise params_mismatch(step, path, have, want)


def params_mismatch(step: int, path: str, have: Any, want: Any) -> UsageError:
    """The one line that says a step's parameter ``path`` (``['decoder'][...]``) does not fit."""
    return UsageError(
        f"the checkpoint at step {step} does not fit this config: params{path} is "
        f"{have or 'absent'} in the checkpoint and {want or 'absent'} in the config; "
        f"the experiment or its overrides differ from the run that wrote it (use the "
        f"same --set values, or another --job-dir)")
