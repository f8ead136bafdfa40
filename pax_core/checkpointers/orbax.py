"""The built-in checkpointer: Orbax writes each step into a temporary directory and renames it
when complete, so an interrupted save never leaves a half-written step behind."""

from __future__ import annotations

from typing import Any

from pax_core.checkpointers.base import Checkpointer, CheckpointSettings, check_params_match


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
        handlers = {"state": ocp.StandardCheckpointHandler(), "input": ocp.JsonCheckpointHandler()}
        self._manager = ocp.CheckpointManager(directory, options=options, item_handlers=handlers)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def save(self, step: int, state: Any, input_state: dict[str, Any]) -> bool:
        if step in self._manager.all_steps():
            return False
        args = self._ocp.args.Composite(
            state=self._ocp.args.StandardSave(state),
            input=self._ocp.args.JsonSave(input_state),
        )
        return self._manager.save(step, args=args, force=True)

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any] | None]:
        saved = self._manager.item_metadata(step)["state"].tree
        check_params_match(step, saved["params"], abstract_state.params)
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
