"""Evaluation over the experiment's non-training datasets."""

from __future__ import annotations

import jax

from pax_core.errors import RunError
from pax_core.plugins.host import PluginHost
from pax_core.run.build import Run
from pax_core.run.steps import make_eval_step


class Evaluator:
    """Runs the jitted eval step over each eval input and averages with the metric weights.

    Per-batch sums are added on the device; the host reads them once per dataset.
    """

    def __init__(self, run: Run, host: PluginHost):
        self.run, self.host = run, host
        partitioner = run.partitioner
        self._step = partitioner.compile_step(
            make_eval_step(run.task.model, partitioner.reduction), run.eval_variables_shardings,
            None, partitioner.replicated)

    def evaluate(self, variables) -> dict[str, dict[str, float]]:
        """``{dataset name: {metric: value}}`` for every eval dataset, of the model's
        ``variables`` (``Run.eval_variables``)."""
        return {data.name: self._evaluate_one(variables, data) for data in self.run.eval_inputs}

    def _evaluate_one(self, variables, data) -> dict[str, float]:
        data.reset()
        sums, count = None, 0
        while data.eval_num_batches < 0 or count < data.eval_num_batches:
            try:
                local = data.get_next()
            except StopIteration:
                break
            except Exception as e:
                raise self.host.provider_error("input", data, e) from e
            out = self._step(variables, self.run.partitioner.global_batch(local))
            sums = out if sums is None else jax.tree.map(lambda a, b: a + b, sums, out)
            count += 1
        if sums is None:
            raise RunError(f"eval input '{data.name}' produced no batch")
        host = jax.device_get(sums)
        metrics = {k: float(v) if w is None else float(v) / max(float(w), 1e-9)
                   for k, (v, w) in host.items()}
        metrics["num_batches"] = float(count)
        return metrics
