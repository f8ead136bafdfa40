"""The train step, compiled ahead of time once for every batch shape the training input gives.

Most inputs give one shape, compiled before the first batch is read. An input that batches by
length (speech in length buckets, so that short utterances are not padded to the longest)
gives a few: each new shape is compiled when its first batch arrives, and kept. The FLOPs of
each compiled step are counted separately, so MFU and HFU average over the steps a summary
covers, each at its own shape's cost. A later shape's compilation happens in the step phase of
the loop's clock, so the summary it falls in shows it as slower steps.
"""

from __future__ import annotations

import time
from typing import Any

import jax

from pax_core.errors import PaxError
from pax_core.plugins.host import PluginHost
from pax_core.run.build import Run
from pax_core.run.memory_use import step_working_bytes
from pax_core.speed.flops import StepFlops, step_flops

ShapeKey = tuple[tuple[str, tuple[int, ...], str], ...]


def shape_key(batch: dict[str, Any]) -> ShapeKey:
    """What a compiled step is specialised to: every array's name, shape and dtype."""
    return tuple(sorted((k, tuple(v.shape), str(v.dtype)) for k, v in batch.items()))


class TrainSteps:
    """``steps(state, batch)`` runs the step compiled for ``batch``'s shapes, compiling it first
    when the shapes are new; ``flops_since_last()`` averages the steps' FLOPs since the
    previous call."""

    def __init__(self, run: Run, host: PluginHost):
        self.run, self.host = run, host
        self._compiled: dict[ShapeKey, tuple[Any, StepFlops]] = {}
        self.compile_sec = 0.0
        # The most any compiled step allocates beyond its arguments, per device.
        self.working_bytes = 0
        self.first_flops = self._compile(run.batch_spec)[1]
        self._model_flops = self._hardware_flops = 0.0
        self._steps = 0

    def _compile(self, batch_spec: dict[str, jax.ShapeDtypeStruct]) -> tuple[Any, StepFlops]:
        started = time.perf_counter()
        try:
            if self.run.first_step is not None and shape_key(batch_spec) == shape_key(
                    self.run.batch_spec):
                compiled = self.run.first_step  # compiled while the run was fitted
            else:
                compiled = self.run.compile_train_step(batch_spec=batch_spec)
        except PaxError:
            raise
        except Exception as e:
            raise self.host.provider_error("model", self.run.task.model, e) from e
        self.compile_sec += time.perf_counter() - started
        flops = step_flops(self.run.task.model, batch_spec, compiled,
                           self.run.partitioner.mesh.size)
        self._compiled[shape_key(batch_spec)] = (compiled, flops)
        platform = self.run.partitioner.mesh.devices.flat[0].platform
        self.working_bytes = max(self.working_bytes, step_working_bytes(compiled, platform))
        return compiled, flops

    def __call__(self, state: Any, batch: dict[str, jax.Array]) -> Any:
        found = self._compiled.get(shape_key(batch))
        if found is None:
            spec = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
            found = self._compile(spec)
        compiled, flops = found
        self._model_flops += flops.model or 0.0
        self._hardware_flops += flops.hardware or 0.0
        self._steps += 1
        try:
            return compiled(state, batch)
        except Exception as e:
            raise self.host.provider_error("model", self.run.task.model, e) from e

    @property
    def num_shapes(self) -> int:
        """How many batch shapes have been compiled."""
        return len(self._compiled)

    def flops_since_last(self) -> StepFlops:
        """FLOPs per step averaged over the steps since the previous call (the first shape's
        before any step ran)."""
        first, steps = self.first_flops, self._steps
        if not steps:
            return first
        flops = StepFlops(self._model_flops / steps if first.model else None, first.formula,
                          self._hardware_flops / steps if first.hardware else None)
        self._model_flops = self._hardware_flops = 0.0
        self._steps = 0
        return flops
