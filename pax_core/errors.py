"""The two kinds of failure the command line tells apart.

A `UsageError` is the user's to fix (a wrong name, a bad override, a mesh that does not fit): it
ends with one line and exit code 2, before anything is written. A `RunError` happens while a run is
under way (a plugin's provider failed, data ran out): it ends with exit code 1. `Stopped` is not a
failure: a run that was asked to stop saved its checkpoint and exits with 128 + the signal.
"""


class PaxError(Exception):
    """Base class of the errors Pax reports as one line instead of a traceback: ``pax:``, the
    ``label``, the message; the process exits with ``exit_code``."""

    exit_code = 1
    label = "error: "


class UsageError(PaxError):
    """A mistake in what the user asked for; nothing has been written yet."""

    exit_code = 2


class RunError(PaxError):
    """A failure during a run, attributed to the component that caused it."""

    exit_code = 1


class Stopped(PaxError):
    """A run that stopped on request (SIGTERM, SIGINT) after saving its checkpoint.

    The exit status is the shell's for that signal, 128 + its number (143 for SIGTERM, 130 for
    SIGINT): shells and schedulers read it as "stopped by that signal", not as a failure of the
    program, and a scheduler that restarts preempted jobs restarts it; the same command resumes.
    """

    label = ""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


def first_line(error: BaseException, limit: int = 200) -> str:
    """``Type: message``, its first line and at most ``limit`` characters: how a failure from a
    library is quoted inside one of Pax's one-line messages."""
    return f"{type(error).__name__}: {error}".splitlines()[0][:limit]


def warn(message: str) -> None:
    """Print one warning line on stderr; used where Pax carries on after a problem."""
    import sys

    print(f"pax: warning: {message}", file=sys.stderr, flush=True)
