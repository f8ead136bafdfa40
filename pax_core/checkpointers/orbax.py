"""The built-in checkpointer: Orbax writes each step into a temporary directory and renames it
when complete, so an interrupted save never leaves a half-written step behind. Each committed
step also gets a checksum record (``pax_core.checkpointers.integrity``), verified before it is
restored; the unfinished save a killed run left behind is removed at the next start."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from pax_core.checkpointers import integrity
from pax_core.checkpointers.base import Checkpointer, CheckpointSettings, check_params_match
from pax_core.checkpointers.integrity import DamagedCheckpoint
from pax_core.errors import warn

TMP_MARK = ".orbax-checkpoint-tmp"


def _first_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".splitlines()[0][:300]


class OrbaxCheckpointer(Checkpointer):
    """Orbax ``CheckpointManager`` under ``JOB_DIR/checkpoints``: asynchronous, keeps the last
    ``max_to_keep`` steps."""

    def __init__(self, directory: str, settings: CheckpointSettings):
        super().__init__(directory, settings)
        import jax
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self._primary = jax.process_index() == 0
        self._unrecorded: list[int] = []
        if self._primary:
            self._remove_unfinished()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=settings.max_to_keep,
            enable_async_checkpointing=settings.async_save,
            create=True,
        )
        handlers = {"state": ocp.StandardCheckpointHandler(), "input": ocp.JsonCheckpointHandler()}
        self._manager = ocp.CheckpointManager(directory, options=options, item_handlers=handlers)

    def _remove_unfinished(self) -> None:
        """Saves a killed run left unfinished: never restorable, removed with one line each
        (Orbax would remove them too, with a warning about temporary directories)."""
        root = Path(self.directory)
        for path in sorted(root.glob(f"*{TMP_MARK}*")) if root.is_dir() else ():
            shutil.rmtree(path, ignore_errors=True)
            warn(f"removed the unfinished save of step {path.name.split('.')[0]} in {root} "
                 f"(the run that wrote it stopped before it was complete)")

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def set_aside(self, step: int) -> str:
        target = Path(self.directory).parent / "damaged_checkpoints" / f"{step}-{int(time.time())}"
        if self._primary:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(Path(self.directory) / str(step)), str(target))
        self._manager.reload()
        return str(target)

    def save(self, step: int, state: Any, input_state: dict[str, Any]) -> bool:
        if step in self._manager.all_steps():
            return False
        args = self._ocp.args.Composite(
            state=self._ocp.args.StandardSave(state),
            input=self._ocp.args.JsonSave(input_state),
        )
        started = self._manager.save(step, args=args, force=True)
        self._record_committed()  # starting this save waited for the earlier ones
        if started:
            self._unrecorded.append(step)
        return started

    def _record_committed(self) -> None:
        if self._primary:
            for step in self._unrecorded:
                integrity.record(Path(self.directory) / str(step))
        self._unrecorded = []

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any] | None]:
        integrity.verify(Path(self.directory) / str(step))
        try:
            saved = self._manager.item_metadata(step)["state"].tree
        except Exception as e:
            raise DamagedCheckpoint(f"its metadata does not read ({_first_line(e)})") from e
        check_params_match(step, saved["params"], abstract_state.params)
        args = self._ocp.args.Composite(
            state=self._ocp.args.StandardRestore(abstract_state),
            input=self._ocp.args.JsonRestore(),
        )
        try:
            restored = self._manager.restore(step, args=args)
        except Exception as e:
            raise DamagedCheckpoint(f"it does not restore ({_first_line(e)})") from e
        return restored.state, restored.input

    def wait(self) -> None:
        self._manager.wait_until_finished()
        self._record_committed()

    def close(self) -> None:
        self.wait()
        self._manager.close()
