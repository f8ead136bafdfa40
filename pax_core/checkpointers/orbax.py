"""The built-in checkpointer: Orbax writes each step into a temporary directory and renames it
when complete (in a ``gs://`` bucket, which cannot rename, it writes ``commit_success.txt``
last), so an interrupted save never passes for a complete step. Each committed
step also gets a checksum record (``pax_core.checkpointers.integrity``), verified before it is
restored; the unfinished save a killed run left behind is removed at the next start. Opened
read-only (a command reading a job that may still be training), it changes nothing.

A save that fails on its storage (a full disk, a read-only or vanished directory) is reported
as soon as it ends, with one line naming the step, the cause and the newest complete step,
which a failed save never touches; its unfinished folder is removed."""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pax_core.checkpointers import integrity
from pax_core.checkpointers.base import (
    Checkpointer,
    CheckpointSettings,
    StepRemoved,
    Weights,
    check_params_match,
    place,
)
from pax_core.checkpointers.integrity import DamagedCheckpoint
from pax_core.errors import RunError, first_line, warn
from pax_core.files import is_remote, job_path, move, remove_tree, storage_failure

TMP_MARK = ".orbax-checkpoint-tmp"
# How long a reader waits for a step that failed to read to disappear (a training job removing
# it) before calling it damaged.
REMOVAL_WAIT = 2.0
_LISTINGS = 5  # tries at listing the steps of a job that drops steps as it trains
COMMITTED = "commit_success.txt"  # Orbax's mark of a complete step in a bucket
WEIGHTS_GROUP_BYTES = 64 * 2**20  # a weights-only step's tensors are written this many at once


def _unfinished(root: Any) -> Iterator[Any]:
    """The saves under ``root`` that never completed: Orbax's temporary folders, and in a
    bucket the step folders without their commit mark."""
    yield from root.glob(f"*{TMP_MARK}*")
    if is_remote(root):
        yield from (path for path in root.iterdir()
                    if path.name.isdigit() and not (path / COMMITTED).exists())


@contextlib.contextmanager
def _quiet_absl(quiet: bool) -> Iterator[None]:
    """absl's warnings (Orbax logs through it) left out while ``quiet``."""
    logger = logging.getLogger("absl")
    level = logger.level
    if quiet:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@functools.cache
def _one_writer_per_array() -> None:
    """With every device in one process, each array is written whole by that process. Orbax's
    replica-parallel saving splits a replicated array into a slice per replica so that several
    hosts share its writing; in one process it only adds, for every array and every replica,
    an eager slice on the device and a write of its own (on 8 data-parallel devices, most of a
    small model's save). Runs of several processes keep it. Done once a process, without
    Orbax's warning that a handler is replaced."""
    import jax
    from orbax.checkpoint import type_handlers
    from orbax.checkpoint._src.metadata import array_metadata_store

    if jax.process_count() > 1:
        return
    handler = type_handlers.ArrayHandler(use_replica_parallel=False,
                                         array_metadata_store=array_metadata_store.Store())
    with _quiet_absl(True):
        type_handlers.register_type_handler(jax.Array, handler, override=True)


class OrbaxCheckpointer(Checkpointer):
    """Orbax ``CheckpointManager`` under ``JOB_DIR/checkpoints``: asynchronous, keeps the last
    ``max_to_keep`` steps."""

    def __init__(self, directory: str, settings: CheckpointSettings):
        super().__init__(directory, settings)
        import jax
        import orbax.checkpoint as ocp

        self._ocp = ocp
        self._root = job_path(directory)
        self._primary = jax.process_index() == 0
        self._unrecorded: list[int] = []
        if settings.read_only:  # the unfinished save may be one a running job is writing
            options = ocp.CheckpointManagerOptions(read_only=True, create=False,
                                                   save_interval_steps=0,
                                                   enable_async_checkpointing=False)
        else:
            self._remove_unfinished(announce=True)
            options = ocp.CheckpointManagerOptions(
                preservation_policy=self._keep(settings),
                enable_async_checkpointing=settings.async_save,
                create=True,
            )
        _one_writer_per_array()
        handlers = {"state": ocp.StandardCheckpointHandler(), "input": ocp.JsonCheckpointHandler()}
        self._manager = self._despite_removals(lambda: ocp.CheckpointManager(
            directory, options=options, item_handlers=handlers))
        self._identity = self._stat()

    def _keep(self, settings: CheckpointSettings) -> Any:
        """Orbax's preservation policy: the newest steps, and those kept by interval."""
        policies = self._ocp.checkpoint_managers
        keep = [policies.LatestN(n=settings.max_to_keep)]
        if settings.keep_interval_steps:
            keep.append(policies.EveryNSteps(interval_steps=settings.keep_interval_steps))
        if settings.keep_interval_seconds:
            keep.append(policies.EveryNSeconds(interval_secs=int(settings.keep_interval_seconds)))
        return policies.AnyPreservationPolicy(keep)

    def _stat(self) -> tuple[int, int] | None:
        try:
            found = os.stat(self.directory)
        except OSError:
            return None
        return found.st_dev, found.st_ino

    def _replaced(self) -> bool:
        """Whether the directory was removed (and perhaps made again) since the run began:
        Orbax then fails in words of its own, with no code to tell the cause by."""
        return self._stat() != self._identity

    def _remove_unfinished(self, announce: bool) -> None:
        """Remove the saves that never completed (process 0): never restorable, and Orbax would
        remove them too, with a warning about temporary directories. ``announce`` says so, one
        line each: at the start, where a killed run left them."""
        root = self._root
        if not self._primary or not root.is_dir():
            return
        for path in sorted(_unfinished(root)):
            remove_tree(path)
            if announce:
                warn(f"removed the unfinished save of step {path.name.split('.')[0]} in {root} "
                     f"(the run that wrote it stopped before it was complete)")

    def _failed(self, what: str, step: int, error: Exception) -> Exception:
        """What to raise for a save that failed: a storage failure as one line (its unfinished
        folder removed, which also gives back the space), anything else as is."""
        replaced = self._replaced()
        found = storage_failure(error, self.directory, removed=replaced)
        if found is None:
            return error
        cause, remedy = found
        self._remove_unfinished(announce=False)
        with contextlib.suppress(Exception):  # what is on disk now is what a resume restores:
            self._manager.reload()  # a save can fail after its step was committed
        steps = [s for s in self._manager.all_steps() if (self._root / str(s)).is_dir()]
        # In a directory made again under the run, a step without its record is not complete.
        unrecorded = ([s for s in steps if not integrity.has_record(self._root / str(s))]
                      if replaced else [])
        aside = self._set_aside(unrecorded)
        intact = self._verifiable([s for s in steps if s not in unrecorded])
        if intact and max(intact) == step:  # committed; removing older steps after it failed
            kept = f"step {step} itself is complete (what failed came after it)"
        elif intact:
            kept = f"the newest complete checkpoint, step {max(intact)}, is intact"
        else:
            kept = "no complete checkpoint is left"
        if aside:
            kept += (f" (step {', '.join(map(str, aside))}, written as the directory went, is "
                     f"set aside in {os.path.dirname(next(iter(aside.values())))})")
        return RunError(f"{what} could not be written to {self.directory} ({cause}); {kept}: "
                        f"{remedy}, then run the same command to resume")

    def _set_aside(self, unrecorded: list[int]) -> dict[int, str]:
        """Set aside the ``unrecorded`` steps of a directory that was removed (and made again)
        under the run; returns where each one that could be moved went. A save in flight as
        the directory went is finished by Orbax into the one made again, which holds only what
        was written after the removal: such a step is no checkpoint to resume from, and the
        checksum record it never got is what tells it. Moved, not deleted: it is what the run
        last wrote."""
        moved = {}
        for step in unrecorded if self._primary else []:
            with contextlib.suppress(OSError):  # the run is failing already: name what moved
                moved[step] = self.set_aside(step, why="unverified")
        return moved

    def _guarded(self, what: str, step: int, action: Callable[[], Any]) -> Any:
        """``action()``; when it fails, the saves still in flight are waited for (so that no
        thread writes on after the run has stopped) and dropped."""
        try:
            return action()
        except Exception as e:
            with contextlib.suppress(Exception):
                self._manager.wait_until_finished()
            self._unrecorded = []
            failure = self._failed(what, step, e)
            if failure is e:
                raise
            raise failure from e

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        if not self.settings.read_only:
            return sorted(self._manager.all_steps())

        def listing() -> list[int]:  # afresh: the job may be training, saving and dropping
            self._manager.reload()
            steps = sorted(self._manager.all_steps())
            if not steps:  # every listed step went as it was listed: list again
                raise FileNotFoundError(errno.ENOENT, "no step listed", self.directory)
            return steps

        try:
            return self._despite_removals(listing)
        except FileNotFoundError:
            return []

    def _despite_removals(self, action: Callable[[], Any]) -> Any:
        """``action`` over the steps a reader lists, done again when it fails on a step folder
        that went meanwhile (Orbax lists each step's files, and the training job drops steps as
        it saves); a writer's steps do not go behind its back, and it does it once."""
        with _quiet_absl(self.settings.read_only):  # notes on the job's saves in progress
            for _ in range(_LISTINGS - 1 if self.settings.read_only else 0):
                try:
                    return action()
                except FileNotFoundError:
                    time.sleep(0.05)
            return action()

    def _writable(self) -> None:
        if self.settings.read_only:
            raise RuntimeError(f"the checkpointer of {self.directory} was opened read-only")

    def set_aside(self, step: int, why: str = "damaged") -> str:
        self._writable()
        target = self._root.parent / f"{why}_checkpoints" / f"{step}-{int(time.time())}"
        if self._primary:
            move(self._root / str(step), target)
        self._manager.reload()
        return str(target)

    def save(self, step: int, state: Any, input_state: dict[str, Any]) -> bool:
        self._writable()
        if self._primary and self._replaced():
            # Orbax would make the directory again and save on into it, unseen, after the job
            # directory holding it was removed: the run stops instead.
            gone = FileNotFoundError(errno.ENOENT, "removed during the run", self.directory)
            raise self._failed(f"checkpoint step {step}", step, gone) from None
        if step in self._manager.all_steps():
            return False
        if isinstance(state, Weights):  # no empty collection: Orbax restores none
            state = {"params": state.params,
                     **({"model_state": state.model_state} if state.model_state else {})}
        args = self._ocp.args.Composite(
            state=self._ocp.args.StandardSave(state),
            input=self._ocp.args.JsonSave(input_state),
        )
        in_flight = self._unrecorded[0] if self._unrecorded else step
        started = self._guarded(f"checkpoint step {in_flight}", in_flight,
                                lambda: self._manager.save(step, args=args, force=True))
        self._record_committed()  # starting this save waited for the earlier ones
        if started:
            self._unrecorded.append(step)
        return started

    def save_weights(self, step: int, tensors: Iterable[tuple[tuple[str, ...], Any]]) -> None:
        """The tensors written into the step as they come, a group of up to
        ``WEIGHTS_GROUP_BYTES`` at a time (Orbax's partial saving, staged beside the step and
        moved into place by its final call; each call has a cost of its own, so tensors are
        not written singly), then the step's checksums."""
        from orbax.checkpoint.experimental import v1

        self._writable()
        target = self._root / str(step)
        group: dict[str, Any] = {}
        held = 0
        # Each save here ends before the next tensor is read, so nothing changes an array
        # Orbax is writing: it need not copy them first (its default guards a training loop).
        writing = v1.Context()
        writing.memory.deepcopy_host_arrays = False
        with writing:
            for path, array in tensors:
                place(group, path, array)
                held += array.nbytes
                if held >= WEIGHTS_GROUP_BYTES:
                    v1.partial.save(target, {"params": group})
                    group, held = {}, 0
            if group:
                v1.partial.save(target, {"params": group})
            v1.partial.finalize(target)
        self._manager.reload()
        integrity.record(target)

    def _record_committed(self) -> None:
        if self._primary:
            for step in self._unrecorded:
                self._guarded(f"the checksums of checkpoint step {step}", step,
                              lambda s=step: integrity.record(self._root / str(s)))
        self._unrecorded = []

    def _earlier_verified(self, step: int, steps: list[int]) -> int | None:
        """The newest of ``steps`` before ``step`` that has its checksum record."""
        return max((s for s in steps if s < step and integrity.has_record(self._root / str(s))),
                   default=None)

    def _verifiable(self, steps: list[int]) -> list[int]:
        """Those of ``steps`` that a restore would take: a step without its checksum record
        (its run died, or its storage failed, between the commit and the record) cannot be
        verified, and one before it that can is trusted instead."""
        return [s for s in steps if integrity.has_record(self._root / str(s))
                or self._earlier_verified(s, steps) is None]

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any] | None]:
        try:
            with _quiet_absl(self.settings.read_only):  # notes on the job's saves in progress
                return self._restore(step, abstract_state)
        except Exception as e:
            if self.settings.read_only and self._vanishes(step):
                raise StepRemoved(f"step {step} was removed while it was read") from e
            raise

    def _vanishes(self, step: int) -> bool:
        """Whether the folder of ``step``, which failed to read, is gone or goes within
        ``REMOVAL_WAIT`` seconds: the training job's checkpointer was removing it
        (``max_to_keep``), its items one after another, as it was read."""
        path, deadline = self._root / str(step), time.monotonic() + REMOVAL_WAIT
        while path.exists():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _restore(self, step: int, abstract_state: Any) -> tuple[Any, dict[str, Any] | None]:
        integrity.verify(self._root / str(step),
                         earlier_verified=self._earlier_verified(step, self._manager.all_steps()))
        try:
            saved = self._manager.item_metadata(step)["state"].tree
        except Exception as e:
            raise DamagedCheckpoint(f"its metadata does not read ({first_line(e, 300)})") from e
        weights_only = "opt_state" not in saved
        check_params_match(step, saved["params"], abstract_state.params, absent_ok=weights_only)
        if weights_only:  # no input position either
            args = self._ocp.args.Composite(
                state=self._ocp.args.StandardRestore(_weights_tree(saved, abstract_state)))
        else:
            args = self._ocp.args.Composite(
                state=self._ocp.args.StandardRestore(abstract_state),
                input=self._ocp.args.JsonRestore(),
            )
        try:
            restored = self._manager.restore(step, args=args)
        except Exception as e:
            raise DamagedCheckpoint(f"it does not restore ({first_line(e, 300)})") from e
        if weights_only:
            return Weights(restored.state["params"], restored.state.get("model_state", {})), None
        return restored.state, restored.input

    def check(self) -> None:
        if self._unrecorded and not self._manager.is_saving_in_progress():
            self.wait()  # the save has ended: this returns at once, or raises its failure

    def wait(self) -> None:
        if self._unrecorded:
            self._guarded(f"checkpoint step {self._unrecorded[0]}", self._unrecorded[0],
                          self._manager.wait_until_finished)
        self._record_committed()

    def close(self) -> None:
        self.wait()
        self._manager.close()


def _held(abstract: Any, saved: Any) -> Any:
    """The part of the ``abstract`` parameters the ``saved`` tree holds."""
    if not isinstance(abstract, dict):
        return abstract
    return {k: _held(v, saved[k]) for k, v in abstract.items() if k in saved}


def _weights_tree(saved: Any, abstract_state: Any) -> dict[str, Any]:
    """What a weights-only step is restored onto: the parameters it holds (``Weights``), and
    the model state if the step holds one (Orbax keeps no empty collection)."""
    tree = {"params": _held(abstract_state.params, saved["params"])}
    if saved.get("model_state"):
        tree["model_state"] = abstract_state.model_state
    return tree
