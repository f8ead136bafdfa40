"""The new folder a command writes (``pax export``, ``pax import``): it only ever appears whole.

It is written beside its destination (``DIR.partial``) and renamed into place when complete;
an existing destination that is not empty is never touched. A command removes only what it
made itself: a ``DIR.partial`` that is already there may be another run's of the same command,
still going, so the command is refused, naming it (a leftover of an interrupted one is the
user's to remove). The checks come first (``OutputFolder(...)``), before the command's slow
part, and the folder is made only when the command writes (``writing()``).
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

from pax_core.errors import RunError, UsageError
from pax_core.files import is_remote, storage_failure


class OutputFolder:
    """``--output`` of ``pax COMMAND``, checked: local, absent or empty, no ``.partial``."""

    def __init__(self, output: str, command: str):
        self.command = command
        if is_remote(output):
            raise UsageError(f"--output {output}: pax {command} writes a local directory (it is "
                             f"renamed into place when complete); copy it to the bucket after")
        self.target = Path(output).expanduser().resolve()
        if self.target.exists() and (not self.target.is_dir() or any(self.target.iterdir())):
            raise UsageError(f"--output {self.target} exists and is not empty; choose a new "
                             f"directory (nothing was changed)")
        self.partial = self.target.with_name(self.target.name + ".partial")
        if self.partial.exists():  # said now; made later only if still absent
            raise self._partial_exists()

    def _partial_exists(self) -> UsageError:
        return UsageError(f"--output {self.target}: {self.partial} exists: another pax "
                          f"{self.command} to it is running, or one was interrupted; if none is "
                          f"running, remove {self.partial} and {self.command} again (nothing "
                          f"was changed)")

    @contextlib.contextmanager
    def writing(self, primary: bool = True) -> Iterator[Path]:
        """The partial folder to write into; renamed into place (by the ``primary`` process)
        when the block ends, removed with what is in it when the block fails. A failure of
        the storage is one line."""
        try:
            self.partial.mkdir(parents=True)  # fails if it exists: then it is not ours
        except FileExistsError:
            raise self._partial_exists() from None
        except OSError as e:
            raise UsageError(f"--output {self.target} cannot be created: {e.strerror}; choose "
                             f"another directory (nothing was changed)") from None
        try:
            yield self.partial
            if primary:
                if self.target.exists():
                    self.target.rmdir()  # empty, checked first
                self.partial.rename(self.target)
        except BaseException as e:
            shutil.rmtree(self.partial, ignore_errors=True)  # made above, by this command
            found = storage_failure(e, self.partial.parent) if isinstance(e, Exception) else None
            if found is None:
                raise
            raise RunError(f"--output {self.target} could not be written ({found[0]}): "
                           f"{found[1]}, then {self.command} again") from e
