"""What each ``pax`` command does, one module per command family: ``jobs`` (``pax train``,
``pax eval``, and ``restore_latest`` for the commands that read a trained job), ``export``,
``plan`` and ``launch``. The typer app (``pax_core.cli.app``) parses the options and calls
these; the machinery they use lives in ``run``, ``parallel``, ``config`` and ``speed``, none of
which imports this package."""
