"""Checkpoints: the interface the loop uses and the Orbax implementation behind it.

A checkpoint holds the train state and the training input's position, so that running the same
command again continues with the next batch. Orbax writes each step into a temporary directory
and renames it when complete, so an interrupted save never leaves a half-written step behind.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class CheckpointSettings:
    save_interval_steps: int
    max_to_keep: int
    async_save: bool = True


class Checkpointer(abc.ABC):
    """Saves and restores ``(state, input_state)`` pairs by step."""

    def __init__(self, directory: str, settings: CheckpointSettings):
        self.directory = directory
        self.settings = settings

    @abc.abstractmethod
    def latest_step(self) -> int | None:
        """The newest complete step, or None."""

    @abc.abstractmethod
    def save(self, step: int, state: Any, input_state: dict[str, Any], *, force: bool = False
             ) -> bool:
        """Save if ``step`` is due (or ``force``); returns whether a save was started."""

    @abc.abstractmethod
    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any] | None]:
        """Restore ``step`` onto the shardings of ``abstract_state`` (``ShapeDtypeStruct``s with
        ``sharding``), which may differ from those it was saved with."""

    @abc.abstractmethod
    def wait(self) -> None:
        """Block until every started save is committed."""

    def close(self) -> None:
        self.wait()


class OrbaxCheckpointer(Checkpointer):
    """Orbax ``CheckpointManager`` under ``JOB_DIR/checkpoints``: asynchronous, keeps the last
    ``max_to_keep`` steps."""

    def __init__(self, directory: str, settings: CheckpointSettings):
        super().__init__(directory, settings)
        import orbax.checkpoint as ocp

        self._ocp = ocp
        options = ocp.CheckpointManagerOptions(
            max_to_keep=settings.max_to_keep,
            enable_async_checkpointing=settings.async_save,
            create=True,
        )
        self._manager = ocp.CheckpointManager(directory, options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state: Any, input_state: dict[str, Any], *, force: bool = False
             ) -> bool:
        due = force or step % self.settings.save_interval_steps == 0
        if not due or step in self._manager.all_steps():
            return False
        args = self._ocp.args.Composite(
            state=self._ocp.args.StandardSave(state),
            input=self._ocp.args.JsonSave(input_state),
        )
        return self._manager.save(step, args=args, force=True)

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any] | None]:
        args = self._ocp.args.Composite(
            state=self._ocp.args.StandardRestore(abstract_state),
            input=self._ocp.args.JsonRestore(),
        )
        restored = self._manager.restore(step, args=args)
        return restored.state, restored.input

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()
