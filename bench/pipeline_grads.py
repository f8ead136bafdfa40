"""A pipeline's gradients against the unpipelined model's: the loss and every parameter's
gradient of one batch, from the same weights, GPipe and circular, as ``pipeline_speed.py``
runs them (the same model, batch and meshes, on 8 fake CPU devices).

The reference is the unpipelined (scanned) model over the same 8 devices (replica 8, as
``pipeline_speed.py`` times it); each configuration is also compared with the same model on one
device, without a mesh. Every configuration starts from the same weights in its stored layout
(GPipe stores the scanned stack's ``[L, ...]``; circular ``[R, L / R, ...]``, the same layers in
the same order), and its gradients are read back in the reference's layout. Reported: the
largest absolute difference of any gradient element, the largest of any parameter's
``max |difference| / max |reference gradient|``, the whole gradient's relative L2 difference,
and the loss's relative difference (float32: round-off is about 1e-7 of a value per
operation).

    python bench/pipeline_grads.py

Writes bench/results/pipeline_grads.{json,md}.
"""

from __future__ import annotations

import functools
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import flax.linen as nn
import jax
import numpy as np
import report
from jax.sharding import Mesh
from pipeline_speed import BATCH, LENGTH, MODEL, configurations, lm_loss

from pax_core import axes
from pax_transformer import TransformerLm


def gradients(model: TransformerLm, params: dict, ids: jax.Array) -> tuple[float, dict]:
    loss, grads = jax.jit(jax.value_and_grad(functools.partial(lm_loss, model)))(params, ids)
    return float(loss), jax.device_get(grads)


def compare(grads: dict, reference: dict) -> dict[str, float]:
    pairs = list(zip(jax.tree.leaves(grads), jax.tree.leaves(reference), strict=True))
    diff_sq = sum(float(np.sum((g - r) ** 2)) for g, r in pairs)
    ref_sq = sum(float(np.sum(r ** 2)) for _, r in pairs)
    return {"max_abs": max(float(np.max(np.abs(g - r))) for g, r in pairs),
            "max_rel": max(float(np.max(np.abs(g - r)) / np.max(np.abs(r))) for g, r in pairs),
            "rel_l2": (diff_sq / ref_sq) ** 0.5,
            "max_abs_reference": max(float(np.max(np.abs(r))) for _, r in pairs)}


def main() -> None:
    ids = jax.random.randint(jax.random.PRNGKey(0), (BATCH, LENGTH + 1), 0, 256)
    single = TransformerLm(**MODEL, scan_layers=True)
    params = jax.device_get(nn.meta.unbox(
        single.init(jax.random.PRNGKey(0), ids[:, :-1])["params"]))
    one_loss, one_device = gradients(single, params, ids)
    found = {}
    for name, (model, shape, rules, _) in configurations().items():
        stored = jax.eval_shape(model.init, jax.random.PRNGKey(0), ids[:, :-1])["params"]
        start = jax.tree.map(lambda w, s: w.reshape(s.shape), params, nn.meta.unbox(stored))
        mesh = Mesh(np.array(jax.devices()).reshape(shape), axes.PIPELINE_MESH)
        with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
            loss, grads = gradients(model, start, ids)
        found[name] = (loss, jax.tree.map(lambda g, w: g.reshape(w.shape), grads, params))
    base_name = next(iter(found))
    base_loss, base = found[base_name]
    rows = []
    for name, (loss, grads) in found.items():
        row = {"configuration": name, "loss": loss,
               "vs_unpipelined": None if name == base_name else {
                   "loss_rel": abs(loss - base_loss) / abs(base_loss), **compare(grads, base)},
               "vs_one_device": {"loss_rel": abs(loss - one_loss) / abs(one_loss),
                                 **compare(grads, one_device)}}
        rows.append(row)
        print(f"  {name}: {row}", flush=True)
    lines = [f"| configuration | vs {base_name}: loss, relative difference | max abs "
             "difference | max relative difference (per parameter) | relative L2 | vs one "
             "device: max relative difference | relative L2 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        same, one = r["vs_unpipelined"], r["vs_one_device"]
        cells = ("- | - | - | -" if same is None else
                 f"{same['loss_rel']:.1e} | {same['max_abs']:.1e} | {same['max_rel']:.1e} | "
                 f"{same['rel_l2']:.1e}")
        lines.append(f"| {r['configuration']} | {cells} | {one['max_rel']:.1e} | "
                     f"{one['rel_l2']:.1e} |")
    lines += ["", f"Loss {base_loss:.6f} ({one_loss:.6f} on one device); the largest gradient "
              f"element {rows[0]['vs_one_device']['max_abs_reference']:.3g}. Relative per "
              "parameter: max |difference| / max |reference gradient| of that parameter, the "
              "largest over the parameters. The pipelines are compared with the same model "
              "unpipelined over the same 8 devices; against one device every configuration, "
              "the unpipelined one included, differs alike: that difference is the 8-device "
              "program's, not the pipeline's."]
    report.save("pipeline_grads", {"model": MODEL, "batch": BATCH, "length": LENGTH,
                                   "devices": 8, "reference": base_name,
                                   "one_device_loss": one_loss, "rows": rows},
                "\n".join(lines))


if __name__ == "__main__":
    main()
