"""The training loop: sharding, gradient accumulation, exact resume, interruption, failures."""

from __future__ import annotations

import gc
import importlib
import json
import os
import signal
import weakref

import flax.linen as nn
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from pax_core import hookimpl
from pax_core.commands import jobs as commands
from pax_core.config.resolve import resolve
from pax_core.errors import RunError, Stopped, UsageError
from pax_core.run.build import build_run
from pax_core.run.state import make_init_fn
from pax_core.testing import isolated_host, register_plugin

TEST_PLUGIN = importlib.import_module("pax_testplugin.plugin")


@pytest.fixture
def host():
    return isolated_host(("testplugin", TEST_PLUGIN))


def _run(host, devices, *overrides):
    resolved = resolve(host, "TinyCounting", None, list(overrides))
    return build_run(host, resolved, devices)


def _train_steps(run, steps: int):
    """Losses and final params of ``steps`` steps, through the same jitted step as the loop."""
    step = run.compile_train_step(donate_state=False)
    state, losses = run.init_state(), []
    for _ in range(steps):
        state, metrics = step(state, run.partitioner.global_batch(run.train_input.get_next()))
        losses.append(float(metrics["loss"]))
    return losses, state


def test_state_is_created_sharded_and_batches_split_over_devices(host):
    run = _run(host, jax.devices())
    state = run.init_state()
    kernel = jax.tree.leaves(state.params)[0]
    assert isinstance(kernel.sharding, NamedSharding)
    assert kernel.sharding.mesh.size == 8
    assert kernel.sharding.spec == PartitionSpec()
    batch = run.partitioner.global_batch(run.train_input.get_next())
    assert batch["ids"].sharding.spec == PartitionSpec("data", None)
    assert {s.data.shape for s in batch["ids"].addressable_shards} == {(2, 16)}


def test_the_state_is_initialised_from_the_trace_build_run_made(host, monkeypatch):
    run = _run(host, jax.devices())
    model = type(run.task.model)
    traced = []
    original = model.__call__
    monkeypatch.setattr(model, "__call__", lambda *a, **k: traced.append(1) or original(*a, **k))
    state = run.init_state()
    assert not traced  # replayed: the model's Python did not run again
    expected = nn.meta.unbox(jax.jit(make_init_fn(run.task.model, run.tx, run.batch_spec))(
        np.uint32(run.task.train.random_seed)))
    assert traced  # (the check above would have seen a trace)
    assert jax.tree.structure(state) == jax.tree.structure(expected)
    for got, want in zip(jax.tree.leaves(state), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(got, want)


def test_eight_devices_match_one_device(host):
    many, _ = _train_steps(_run(host, jax.devices()), 3)
    one, _ = _train_steps(_run(host, jax.devices()[:1]), 3)
    np.testing.assert_allclose(many, one, rtol=1e-5)


def test_gradient_accumulation_matches_the_full_batch(host):
    full, full_state = _train_steps(_run(host, jax.devices()[:2]), 2)
    micro, micro_state = _train_steps(
        _run(host, jax.devices()[:2], "task.train.learner.num_microbatches=4"), 2
    )
    np.testing.assert_allclose(micro, full, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(full_state.params), jax.tree.leaves(micro_state.params),
                    strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_microbatches_must_divide_the_per_device_batch(host):
    with pytest.raises(UsageError, match="num_microbatches 3 must divide"):
        _run(host, jax.devices(), "task.train.learner.num_microbatches=3")


def test_batch_that_does_not_divide_over_devices_is_refused_before_writing(host, tmp_path):
    job_dir = tmp_path / "job"
    with pytest.raises(UsageError, match="does not divide over the 8 batch shards"):
        commands.train(host, exp="TinyCounting", plugin=None, job_dir=str(job_dir),
                       set_items=["datasets[0].batch_size=12"])
    assert not job_dir.exists()


def _losses(job_dir) -> dict[int, float]:
    lines = (job_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if r["kind"] == "train"}


def test_resume_continues_exactly_where_it_stopped(host, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    commands.train(host, exp="TinyCounting", plugin=None, job_dir=str(straight), set_items=[])
    commands.train(host, exp="TinyCounting", plugin=None, job_dir=str(split),
                   set_items=["task.train.num_train_steps=40"])
    commands.train(host, exp="TinyCounting", plugin=None, job_dir=str(split), set_items=[])
    assert _losses(split)[60] == pytest.approx(_losses(straight)[60], rel=1e-6)
    assert len((split / "runs.jsonl").read_text().splitlines()) == 2


def test_sigterm_saves_a_checkpoint_and_stops(host, tmp_path):
    class Preempt:
        @hookimpl
        def pax_on_metrics(self, run, step, kind, metrics):
            if step == 10:
                os.kill(os.getpid(), signal.SIGTERM)

    with register_plugin(host, Preempt(), "preempt"), pytest.raises(
        Stopped, match=r"stopped on request \(SIGTERM\) at step 10"
    ) as stopped:
        commands.train(host, exp="TinyCounting", plugin=None, job_dir=str(tmp_path), set_items=[])
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["10"]
    assert stopped.value.exit_code == 128 + signal.SIGTERM


def test_failing_input_stops_the_run_naming_its_plugin(host, tmp_path, monkeypatch):
    from pax_testplugin.inputs import CountingInput

    def broken(self):
        if self.index >= 3:
            raise OSError("disk went away")
        self.index += 1
        return real_get_next(self)

    real_get_next = CountingInput.get_next
    monkeypatch.setattr(CountingInput, "get_next", broken)
    with pytest.raises(RunError) as info:
        commands.train(host, exp="TinyCounting", plugin=None, job_dir=str(tmp_path), set_items=[])
    message = str(info.value)
    assert "input CountingInput from plugin 'testplugin'" in message
    assert "OSError: disk went away" in message


def test_job_dir_of_another_experiment_is_left_alone(host, tmp_path):
    commands.train(host, exp="TinyCounting", plugin=None, job_dir=str(tmp_path),
                   set_items=["task.train.num_train_steps=10"])
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    with pytest.raises(UsageError, match="holds a run of testplugin/TinyCounting"):
        commands.train(host, exp="MlpSynthetic", plugin=None, job_dir=str(tmp_path),
                       set_items=[])
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


def test_eval_reads_the_latest_checkpoint(host, tmp_path):
    commands.train(host, exp="TinyCounting", plugin=None, job_dir=str(tmp_path), set_items=[])
    step, results = commands.evaluate(host, exp=None, plugin=None, set_items=[],
                                      job_dir=str(tmp_path))
    assert step == 60
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    final_eval = [r for r in records if r["kind"] == "eval/test"][-1]
    assert results["test"]["loss"] == pytest.approx(final_eval["loss"], rel=1e-6)


def test_resume_with_a_config_that_does_not_fit_the_checkpoint_changes_nothing(host, tmp_path):
    commands.train(host, exp="TinyCounting", plugin=None, job_dir=str(tmp_path),
                   set_items=["task.train.num_train_steps=20"])
    def record():  # of the job, not the lock a run takes
        return {p: p.read_bytes() for p in tmp_path.glob("*.*") if p.name != "train.lock"}

    before = record()
    with pytest.raises(UsageError, match=r"the checkpoint at step 20 does not fit this config: "
                                         r"params\['Dense_0'\]\['bias'\] is \(128,\) in the "
                                         r"checkpoint and \(64,\) in the config"):
        commands.train(host, exp="TinyCounting", plugin=None, job_dir=str(tmp_path),
                       set_items=["DIM=16"])
    assert record() == before


def test_checkpoint_notifications_come_after_the_commit(host, tmp_path):
    seen = []

    class Watcher:
        @hookimpl
        def pax_on_checkpoint_saved(self, run, step, directory):
            seen.append((step, (tmp_path / "checkpoints" / str(step)).is_dir()))

    with register_plugin(host, Watcher(), "watcher"):
        commands.train(host, exp="TinyCounting", plugin=None, job_dir=str(tmp_path),
                       set_items=[])
    assert seen == [(20, True), (40, True), (60, True)]


def test_the_first_state_is_let_go_once_training_moves_on(host, tmp_path, monkeypatch):
    """No frame may keep the restored or initialised state: on a CPU no state is donated, so
    a held first state would stay in memory beside the ones the steps make."""
    first, alive = [], []

    def restore_or_init(*args, **kwargs):
        state, step = restored(*args, **kwargs)
        first.append(weakref.ref(jax.tree.leaves(state.params)[0]))
        return state, step

    class Probe:
        @hookimpl
        def pax_on_metrics(self, run, step, kind, metrics):
            if kind == "train":
                gc.collect()
                alive.append(first[0]() is not None)

    restored = commands.restore_or_init
    monkeypatch.setattr(commands, "restore_or_init", restore_or_init)
    with register_plugin(host, Probe(), "probe"):
        commands.train(host, exp="TinyCounting", plugin=None, job_dir=str(tmp_path),
                       set_items=["NUM_TRAIN_STEPS=8", "task.train.summary_interval_steps=4"])
    assert alive == [False, False]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("task.train.summary_interval_steps=0", "summary_interval_steps must be >= 1"),
        ("task.train.save_interval_steps=0", "save_interval_steps must be >= 1"),
        ("task.train.learner.num_microbatches=0", "num_microbatches must be >= 1"),
        ("datasets[0].batch_size=0", "batch_size must be >= 1"),
        ("datasets[1].eval_num_batches=0", "eval_num_batches must be >= 1 or -1"),
    ],
)
def test_settings_out_of_range_are_usage_errors(host, tmp_path, item, message):
    with pytest.raises(UsageError, match=message):
        commands.train(host, exp="TinyCounting", plugin=None, job_dir=str(tmp_path / "job"),
                       set_items=[item])
    assert not (tmp_path / "job").exists()


def test_failing_eval_input_stops_the_run_naming_its_plugin(host, tmp_path, monkeypatch):
    from pax_testplugin.inputs import CountingInput

    real_get_next = CountingInput.get_next

    def broken(self):
        if not self.is_training:
            raise ValueError("corrupt shard")
        return real_get_next(self)

    monkeypatch.setattr(CountingInput, "get_next", broken)
    with pytest.raises(RunError, match="input CountingInput from plugin 'testplugin' "
                                       r"\(pax-testplugin 0.1.0\) failed: ValueError: corrupt"):
        commands.train(host, exp="TinyCounting", plugin=None, job_dir=str(tmp_path), set_items=[])


def test_the_cpu_backend_keeps_the_old_state(host):
    """Donation is the backend's choice: XLA:CPU runs donated steps slower."""
    run = _run(host, jax.devices())
    assert run.donates_train_state is False
    state = run.init_state()
    run.compile_train_step()(state, run.partitioner.global_batch(run.train_input.get_next()))
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(state.params))
    donated = run.compile_train_step(donate_state=True)
    donated(state, run.partitioner.global_batch(run.train_input.get_next()))
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state.params))
