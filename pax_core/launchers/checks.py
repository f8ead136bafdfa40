"""What ``pax launch`` can check of the command it launches before anything starts: that a
``pax train`` of an experiment with a multi-slice mesh runs on as many slices as its
``DCN_MESH_SHAPE`` spans (found out here in a second, rather than on every worker after the
slices were paid for and the program compiled)."""

from __future__ import annotations

import math

from pax_core.errors import UsageError
from pax_core.plugins.host import PluginHost

_VALUED = {"--exp": "exp", "-e": "exp", "--plugin": "plugin", "-p": "plugin", "--set": "set",
           "-s": "set"}


def _train_options(command: list[str]) -> dict[str, list[str]] | None:
    """The ``--exp``, ``--plugin`` and ``--set`` values of a ``pax train`` command, or None
    when the command is not one."""
    if command[:2] != ["pax", "train"]:
        return None
    found: dict[str, list[str]] = {"exp": [], "plugin": [], "set": []}
    words = iter(command[2:])
    for word in words:
        name, sep, value = word.partition("=")
        if name in _VALUED:
            found[_VALUED[name]].append(value if sep else next(words, ""))
    return found


def check_slices(host: PluginHost, command: list[str], slices: int) -> None:
    """Refuse a ``pax train`` whose experiment's DCN mesh spans another number of slices. An
    experiment this machine cannot find (a plugin only the workers have) is left to them."""
    from pax_core.config.resolve import experiment_class

    options = _train_options(command)
    if not options or not options["exp"]:
        return
    try:
        _, cls = experiment_class(host, options["exp"][-1],
                               options["plugin"][-1] if options["plugin"] else None,
                               options["set"])
    except UsageError:
        return
    if not getattr(cls, "ICI_MESH_SHAPE", None):
        return
    dcn = list(cls.DCN_MESH_SHAPE or [1] * len(cls.ICI_MESH_SHAPE))
    if math.prod(dcn) != slices:
        raise UsageError(f"{cls.__name__}'s DCN_MESH_SHAPE {dcn} spans {math.prod(dcn)} "
                         f"slice(s) and pax launch starts {slices}; give --slices "
                         f"{math.prod(dcn)}, or --set DCN_MESH_SHAPE=... to span {slices}")
