"""The two kinds of failure the command line tells apart.

A `UsageError` is the user's to fix (a wrong name, a bad override, a mesh that does not fit): it
ends with one line and exit code 2, before anything is written. A `RunError` happens while a run is
under way (a plugin's provider failed, data ran out): it ends with exit code 1.
"""


class PaxError(Exception):
    """Base class of the errors Pax reports as one line instead of a traceback."""

    exit_code = 1


class UsageError(PaxError):
    """A mistake in what the user asked for; nothing has been written yet."""

    exit_code = 2


class RunError(PaxError):
    """A failure during a run, attributed to the component that caused it."""

    exit_code = 1


def warn(message: str) -> None:
    """Print one warning line on stderr; used where Pax carries on after a problem."""
    import sys

    print(f"pax: warning: {message}", file=sys.stderr, flush=True)
