"""The ``pipeline`` partitioner: SPMD over a mesh with a ``stage`` axis, and the checks and
numbers of a pipelined run.

It shards like ``spmd`` with Pax's pipelined rules (``pax_core.axes.PIPELINE_RULES``: stacked
layer weights split by stage, the batch outside the pipeline split over stage, replica and
data) and reads the experiment's pipeline constants, Pax's names: ``NUM_STAGES``,
``NUM_MICROBATCHES`` or ``MICROBATCH_SIZE``, ``CIRCULAR_REPEAT``, ``STREAM_IO``. Everything a
user can get wrong about them is a ``UsageError`` before anything is written; the schedule's
iterations and bubble are reported through ``describe``.
"""

from __future__ import annotations

from typing import Any

import jax

from pax_core import Spmd, UsageError, axes
from pax_pipeline.schedule import Schedule, experiment_settings


def experiment_schedule(experiment: Any) -> Schedule:
    """The schedule an experiment's Pax constants declare; a ``UsageError`` naming them when
    they are inconsistent."""
    try:
        return Schedule(**experiment_settings(experiment))
    except ValueError as e:
        raise UsageError(f"pipeline settings: {e}") from None


class PipelinePartitioner(Spmd):
    """SPMD with pipeline stages on the ``stage`` mesh axis."""

    default_rules = axes.PIPELINE_RULES

    def setup(self, experiment: Any, devices: list[jax.Device]) -> None:
        names = list(experiment.MESH_AXIS_NAMES)
        if axes.STAGE not in names:
            raise UsageError(
                f"PARTITIONER 'pipeline' needs a '{axes.STAGE}' mesh axis, and "
                f"MESH_AXIS_NAMES is {names}; use {list(axes.PIPELINE_MESH)} with the stages "
                f"first in ICI_MESH_SHAPE or DCN_MESH_SHAPE")
        self.schedule = experiment_schedule(experiment)
        super().setup(experiment, devices)
        stages = self.mesh.shape[axes.STAGE]
        if stages != self.schedule.num_stages:
            raise UsageError(
                f"NUM_STAGES is {self.schedule.num_stages} but the mesh's '{axes.STAGE}' axis "
                f"has {stages} devices (ICI_MESH_SHAPE x DCN_MESH_SHAPE); make them equal")

    def check_batch_size(self, name: str, batch_size: int) -> None:
        super().check_batch_size(name, batch_size)
        try:
            self.schedule.microbatches(batch_size)
        except ValueError as e:
            raise UsageError(f"dataset '{name}': {e}; change MICROBATCH_SIZE or "
                             f"NUM_MICROBATCHES, or the batch size") from None

    def describe(self, batch_size: int) -> dict[str, Any]:
        return self.schedule.describe(batch_size)
