"""Mesh layouts: which device sits where in an experiment's ICI x DCN mesh, and what the
runtime needs to know about slices before JAX starts.

Every mesh axis is (DCN part) x (ICI part): the devices of one slice fill the ICI part, and
collectives over ICI axes stay inside a slice. The built-in ``contiguous`` layout takes the
devices in JAX's order, one run of consecutive devices per slice; that is right on one host
and for processes as slices, but not for real TPU slices, whose devices must be grouped by
their ``slice_index`` and ordered along the chips' physical links. A plugin (pax-multislice)
registers a layout that does that; an experiment with DCN axes uses it when it is installed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pax_core.backends.presets import Preset
from pax_core.errors import UsageError
from pax_core.parallel.processes import DistributedOptions

if TYPE_CHECKING:
    from pax_core.plugins.host import PluginHost

BUILT_IN = "contiguous"


class MeshLayout:
    """Arranges devices as an ICI x DCN mesh; the base class is the ``contiguous`` layout."""

    def presets(self, dcn: Sequence[int], processes: DistributedOptions) -> list[Preset]:
        """Environment and flags this layout needs for a mesh of ``dcn`` slices, applied before
        JAX starts (``processes``: how this process joins the run, as far as it was told)."""
        del dcn, processes
        return []

    def device_grid(self, devices: Sequence[Any], ici: Sequence[int], dcn: Sequence[int]
                    ) -> np.ndarray:
        """``devices`` as an array of shape ``[d * i for d, i in zip(dcn, ici)]``."""
        grid = np.asarray(list(devices)).reshape(*dcn, *ici)
        order = [i for axis in range(len(ici)) for i in (axis, axis + len(ici))]
        return grid.transpose(order).reshape([d * i for d, i in zip(dcn, ici, strict=True)])


def layout_name(host: PluginHost, experiment: Any) -> str:
    """The experiment's ``MESH_LAYOUT``, else (for a mesh of more than one slice) the one
    layout a plugin registers, else the built-in one."""
    if experiment.MESH_LAYOUT:
        return experiment.MESH_LAYOUT
    if math.prod(experiment.DCN_MESH_SHAPE or [1]) == 1:
        return BUILT_IN
    offered = [e for e in host.components("mesh_layouts") if e.plugin != "core"]
    if len(offered) > 1:
        names = " and ".join(f"'{e.qualified_name}'" for e in offered)
        raise UsageError(f"the mesh has DCN axes and two plugins lay such meshes out ({names}); "
                         f"choose one with --set MESH_LAYOUT=NAME")
    return offered[0].name if offered else BUILT_IN


def mesh_layout(host: PluginHost, experiment: Any) -> tuple[str, MeshLayout]:
    """The experiment's layout: its name (as the start record shows it) and the layout."""
    name = layout_name(host, experiment)
    try:
        entry = host.components("mesh_layouts").get(name)
    except UsageError as e:
        raise UsageError(f"{e} (set by the experiment's MESH_LAYOUT)") from None
    return name, entry.build()
