"""``pax plan --target``: the HLO reader's collectives and FLOPs, the roofline, the placement of
mesh axes on a target, and the command (tiny model, tiny target) with its refusals.

The collectives are compiled for real on the test process's 8 fake CPU devices, and their
payloads are checked against sizes worked out by hand from the shapes.
"""

from __future__ import annotations

import itertools
import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from pax_core.commands.plan_search import TIE
from pax_core.speed import hlo
from pax_core.speed.hardware import parse_target
from pax_core.speed.predict import Layout, predict
from pax_core.testing import run_pax

F32 = 4


def _mesh() -> Mesh:
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("a", "b"))


def _collectives(fn, *shapes) -> list[hlo.Collective]:
    text = jax.jit(fn).lower(*shapes).compile().as_text()
    return [c.collective for c in hlo.step_costs(text, 8) if c.collective is not None]


def _blocks(mesh: Mesh):
    # A [8, 64] float32 array in blocks of [4, 16] (256 bytes) over a 2 x 4 mesh.
    return jax.ShapeDtypeStruct((8, 64), jnp.float32, sharding=NamedSharding(mesh, P("a", "b")))


def _shard_map(mesh, fn, out):
    return jax.shard_map(fn, mesh=mesh, in_specs=P("a", "b"), out_specs=out, check_vma=False)


ROWS = [[0, 1, 2, 3], [4, 5, 6, 7]]  # the groups of axis "b" (devices in mesh order)
COLUMNS = [[0, 4], [1, 5], [2, 6], [3, 7]]  # of axis "a"


@pytest.mark.parametrize("kind, body, out, payload, groups", [
    # all-gather: the gathered [4, 64] block.
    ("all-gather", lambda v: jax.lax.all_gather(v, "b", axis=1, tiled=True), P("a", None),
     4 * 64 * F32, ROWS),
    # reduce-scatter: the unreduced [4, 16] operand.
    ("reduce-scatter", lambda v: jax.lax.psum_scatter(v, "b", scatter_dimension=1, tiled=True),
     P("a", "b"), 4 * 16 * F32, ROWS),
    # all-reduce: the [4, 16] buffer, over the other axis.
    ("all-reduce", lambda v: jax.lax.psum(v, "a"), P(None, "b"), 4 * 16 * F32, COLUMNS),
    ("all-to-all", lambda v: jax.lax.all_to_all(v, "b", 0, 0, tiled=True), P("a", "b"),
     4 * 16 * F32, ROWS),
])
def test_collectives_payloads_and_groups_as_worked_out_by_hand(kind, body, out, payload,
                                                               groups):
    mesh = _mesh()
    [found] = _collectives(_shard_map(mesh, body, out), _blocks(mesh))
    assert (found.kind, found.payload_bytes) == (kind, payload)
    assert sorted(map(sorted, found.groups)) == groups


def test_collective_permute_payload_and_pairs():
    mesh = _mesh()
    ring = [(i, (i + 1) % 4) for i in range(4)]
    [found] = _collectives(_shard_map(mesh, lambda v: jax.lax.ppermute(v, "b", ring),
                                      P("a", "b")), _blocks(mesh))
    assert (found.kind, found.payload_bytes) == ("collective-permute", 4 * 16 * F32)
    assert set(found.pairs) == {(0, 1), (1, 2), (2, 3), (3, 0), (4, 5), (5, 6), (6, 7), (7, 4)}


def test_an_all_reduce_the_cpu_leaves_before_a_slice_is_read_as_a_reduce_scatter():
    """A sum over a sharded axis into a sharded result: the accelerators' compilers make it a
    reduce-scatter of the [64, 32] partial sums; the CPU's leaves an all-reduce and a slice."""
    mesh = _mesh()
    spec = jax.ShapeDtypeStruct((8, 64, 32), jnp.float32,
                                sharding=NamedSharding(mesh, P("a", None, None)))
    summed = jax.jit(lambda v: v.sum(0), out_shardings=NamedSharding(mesh, P("a", None)))
    text = summed.lower(spec).compile().as_text()
    assert "all-reduce(" in text and "reduce-scatter(" not in text
    [found] = [c.collective for c in hlo.step_costs(text, 8) if c.collective]
    assert (found.kind, found.payload_bytes) == ("reduce-scatter", 64 * 32 * F32)
    assert sorted(map(sorted, found.groups)) == COLUMNS


@pytest.mark.parametrize("text, groups", [
    ("replica_groups={{0,2},{1,3}}, x", [[0, 2], [1, 3]]),
    ("replica_groups=[2,2]<=[4], x", [[0, 1], [2, 3]]),
    ("replica_groups=[2,2]<=[2,2]T(1,0), x", [[0, 2], [1, 3]]),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=2] {'axis_0'}, x", [[0, 2], [1, 3]]),
    ("replica_groups=mesh['axis_0'=2,'axis_1'=2], device_ids=([2,2]T(1,0)) {'axis_1'}, x",
     [[0, 2], [1, 3]]),
    ("channel_id=1, x", [[0, 1, 2, 3]]),
])
def test_every_spelling_of_replica_groups(text, groups):
    assert hlo.replica_groups(text, 4) == groups


def _costs_of(fn, *shapes):
    text = jax.jit(fn).lower(*shapes).compile().as_text()
    return text, hlo.step_costs(text, 1)


@pytest.mark.parametrize("m, k, n", [(4096, 4096, 4096), (8, 8192, 8192)])
def test_the_roofline_of_one_matmul_is_its_analytic_value(m, k, n):
    """A square product is bound by FLOPs and a skinny one by memory; on an H100 each takes
    max(2mkn / (989e12 x 0.803), 4(mk + kn + mn) / (3350e9 x HBM efficiency))."""
    a = jax.ShapeDtypeStruct((m, k), jnp.float32)
    b = jax.ShapeDtypeStruct((k, n), jnp.float32)
    text, costs = _costs_of(jnp.matmul, a, b)
    [product] = [c for c in costs if c.flops]
    assert product.flops == 2 * m * k * n
    assert product.bytes == F32 * (m * k + k * n + m * n)
    target = parse_target("h100-1")
    chip = target.chip
    expected = max(2 * m * k * n / (chip.peak_tflops["bf16"] * 1e12 * chip.matmul_efficiency),
                   F32 * (m * k + k * n + m * n) / (chip.hbm_gbps * 1e9 * chip.hbm_efficiency))
    found = predict(text, target, mesh_shape=(1,), ici=(1,), dcn=(1,), model_flops=None,
                    tokens=None, state_gib=0.0, total_gib=0.0)
    assert found.step_seconds == pytest.approx(expected, rel=1e-9)
    assert found.bottleneck == ("matmul compute" if m > 8 else "memory bandwidth")


def test_scanned_layers_count_once_per_iteration():
    def layers(x, ws):
        return jax.lax.scan(lambda h, w: (h @ w, None), x, ws)[0]

    x = jax.ShapeDtypeStruct((64, 128), jnp.float32)
    ws = jax.ShapeDtypeStruct((6, 128, 128), jnp.float32)
    _, costs = _costs_of(layers, x, ws)
    assert sum(c.flops * c.executions for c in costs) == 6 * 2 * 64 * 128 * 128


def test_an_axis_that_takes_whole_torus_dimensions_gets_their_wraparound_links():
    """v5p-256 is a 4x4x8 torus of 128 chips: a mesh axis of 8 takes the 8 (both directions),
    one of 16 the two 4s (four links each way); an all-gather over the 16 is as fast as one
    over 8 of half the bytes."""
    target = parse_target("v5p-256")
    layout = Layout(target, mesh_shape=(16, 8), ici=(16, 8), dcn=(1, 1))
    link = target.chip.ici.link_gbps * 1e9
    over_8 = hlo.Collective("all-gather", 8e9, [list(range(8))])
    over_16 = hlo.Collective("all-gather", 8e9, [list(range(0, 128, 8))])
    seconds_8, level = layout.seconds(over_8)
    latency = target.chip.ici.hop_latency_us * 1e-6
    assert level == "ici"
    assert seconds_8 == pytest.approx(8e9 * 7 / 8 / (2 * link) + 3.5 * latency)
    seconds_16, _ = layout.seconds(over_16)
    assert seconds_16 == pytest.approx(8e9 * 15 / 16 / (4 * link) + 7.5 * latency)


def test_across_slices_the_dcn_bounds_a_data_parallel_all_reduce():
    target = parse_target("v5e-16", slices=2)
    layout = Layout(target, mesh_shape=(2, 16), ici=(1, 16), dcn=(2, 1))
    gradients = hlo.Collective("all-reduce", 1e9, [[0, 16]])
    seconds, level = layout.seconds(gradients)
    chip = target.chip
    assert level == "dcn"
    assert seconds == pytest.approx(2 * (1e9 / 2 / (chip.dcn.gbps_per_chip * 1e9)
                                         + chip.dcn.latency_us * 1e-6))


def test_gpus_fill_nvlink_domains_in_order():
    target = parse_target("h100-16")
    layout = Layout(target, mesh_shape=(16,), ici=(16,), dcn=(1,))
    chip = target.chip
    inside, level = layout.seconds(hlo.Collective("all-gather", 1e9, [list(range(8))]))
    assert level == "nvlink"
    assert inside == pytest.approx(1e9 * 7 / 8 / (chip.nvlink.gbps * 1e9)
                                   + 7 * chip.nvlink.latency_us * 1e-6)
    across, level = layout.seconds(hlo.Collective("all-gather", 1e9, [[0, 8]]))
    assert level == "network"
    assert across == pytest.approx(1e9 / 2 / (chip.network.gbps_per_gpu * 1e9)
                                   + chip.network.latency_us * 1e-6)


TINY = ["--exp", "TinyLmForTests", "--plugin", "lm", "--set", "ICI_MESH_SHAPE=[1,4,2]"]


def test_pax_plan_target_predicts_a_tiny_model_on_a_tiny_target():
    out = run_pax("plan", *TINY, "--target", "v5e-8", "--format", "json", timeout=300)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)["prediction"]
    assert found["target"] == "v5e-8" and found["chips"] == 8
    assert found["step_seconds"] > 0 and 0 < found["mfu"] < 1
    assert found["step_seconds"] >= found["compute_seconds"]
    assert found["tokens_per_sec_per_chip"] == pytest.approx(
        json.loads(out.stdout)["tokens_per_step"] / found["step_seconds"] / 8)
    # A model this small waits on its collectives' latency.
    assert found["bottleneck"] == "ici collectives"
    costs = found["top_costs"]
    assert [c["seconds"] for c in costs] == sorted((c["seconds"] for c in costs), reverse=True)
    assert all(c["what"] in ("matmul", "memory")
               or re.fullmatch(r"[a-z\-]+ over (data|mdl|data\+mdl) \(ici\)", c["what"])
               for c in costs), costs


REFUSED = [
    (["--target", "v9-8"], "unknown chip 'v9'"),
    (["--target", "v5e-7"], "no published v5e slice has 7 chips"),
    (["--target", "v5e-16"], "has 8 devices and v5e-16 has 16 chips"),
    (["--target", "v5e-4", "--slices", "2"], "needs a DCN_MESH_SHAPE over 2 slices"),
    (["--target", "h100-8", "--slices", "2"], "slices are TPU slices"),
    (["--search"], "--search ranks meshes for a --target"),
    (["--slices", "2"], "describe a --target"),
    (["--vary", "CHECKPOINT_POLICY=SAVE_NOTHING"], "go with --search"),
    (["--target", "v5e-8", "--search", "--search-limit", "2"], "--search-limit is 2"),
    (["--target", "v5e-8", "--search", "--vary", "CHECKPOINT_POLICY"], "NAME=VALUE"),
]


def test_a_target_the_mesh_cannot_fill_is_one_line_and_exit_2():
    out = run_pax("plan", *TINY, *REFUSED[2][0])
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert lines[0].startswith("pax: error: ") and REFUSED[2][1] in lines[0]


def test_every_bad_target_is_refused_before_planning():
    """Each mistake through pax's own app in this process (typer's runner): the usage error
    the command prints in one line with exit 2 (as the test above shows for one)."""
    from typer.testing import CliRunner

    from pax_core.cli.app import build_app
    from pax_core.errors import UsageError
    from pax_core.plugins.host import PluginHost

    host = PluginHost()  # the installed plugins, pax-lm's experiments among them
    app = build_app(host)
    for args, words in REFUSED:
        result = CliRunner().invoke(app, ["plan", *TINY, *args], obj=host)
        assert isinstance(result.exception, UsageError), (args, result.output, result.exception)
        assert words in str(result.exception) and result.exception.exit_code == 2
        assert "\n" not in str(result.exception)


def test_pax_plan_search_ranks_the_meshes_of_a_tiny_target():
    out = run_pax("plan", *TINY, "--target", "v5e-8", "--search", "--format", "json",
                  timeout=600)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    ranked = found["ranked"]
    assert ranked and found["tried"] == len(ranked) + sum(found["dropped"].values())
    steps = [c["prediction"]["step_seconds"] for c in ranked]
    # Fastest first; those within TIE of a faster one's time go by memory (plan_search.rank).
    assert all(later >= earlier / (1 + TIE) for earlier, later in itertools.pairwise(steps))
    meshes = [c["set"][0] for c in ranked]
    assert len(set(meshes)) == len(meshes)
    assert all(math.prod(json.loads(m.split("=")[1])) == 8 for m in meshes)
    best = ranked[0]
    assert best["command"] == (f"pax train --exp TinyLmForTests --plugin lm --set {best['set'][0]}")


def test_candidates_as_fast_as_a_faster_one_rank_by_memory():
    """Step times within 1% are a tie (the model is not that exact): the mesh that needs less
    memory goes first; a clearly faster one still wins."""
    from pax_core.commands.plan_search import Candidate, rank
    from pax_core.speed.predict import Prediction

    def candidate(name, seconds, gib):
        prediction = Prediction("v5e-8", 8, seconds, seconds, 0.0, 0.0, None, None, "matmul",
                                16.0, "yes", "", [])
        return Candidate([name], name, "", prediction, gib, "")

    found = rank([candidate("a", 10.05, 40), candidate("b", 10.0, 56), candidate("c", 9.0, 60),
                  candidate("d", 12.0, 10)])
    assert [c.mesh_text for c in found] == ["c", "a", "b", "d"]
