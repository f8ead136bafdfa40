"""Pax's optimizers: Adafactor's arithmetic against Optax and against its formulas, Lion's
sign updates, the parameter EMA and its use in evaluation, export and bad settings; each chosen
by name (``--set OPTIMIZER=...``) and learning."""

from __future__ import annotations

import json

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import PartitionSpec

from pax_core import Adafactor, Adam, Lion, Sgd
from pax_core.config.schedules import LinearRampupCosineDecay
from pax_core.config.single_task import OPTIMIZERS
from pax_core.config.transforms import AdafactorState
from pax_core.errors import UsageError
from pax_core.run.state import TrainState, ema_params, logical_axes
from pax_core.testing import (
    first_batch_losses,
    isolated_host,
    read_metrics,
    read_params,
    run_pax,
    train,
)
from pax_core.testing.conformance import LEARNING_RATES, TRAIN_STEPS, going_down


def _params(key=0):
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(key), 4)
    # w4's last two dimensions are its smallest: Pax factors them all the same (Optax would not).
    return {"w": jax.random.normal(k1, (160, 130)) * 0.05, "b": jax.random.normal(k2, (130,)),
            "w3": jax.random.normal(k3, (2, 12, 8)), "w4": jax.random.normal(k4, (16, 3, 5))}


def _grads(step: int, params):
    keys = jax.random.split(jax.random.PRNGKey(100 + step), len(params))
    return {name: jax.random.normal(k, p.shape) for k, (name, p) in
            zip(keys, sorted(params.items()), strict=True)}


def _run(tx, params, steps: int):
    state = tx.init(params)
    for step in range(steps):
        updates, state = tx.update(_grads(step, params), state, params)
        params = optax.apply_updates(params, updates)
    return params, state


def test_adafactor_state_is_factored_over_the_last_two_dimensions():
    state = Adafactor().build().init(_params())
    [adafactor] = [s for s in state if isinstance(s, AdafactorState)]
    shapes = {k: (adafactor.v_row[k].shape, adafactor.v_col[k].shape, adafactor.v[k].shape)
              for k in ("w", "b", "w3", "w4")}
    # Pax factors every parameter of rank >= 2 over its last two dimensions, whatever sizes.
    assert shapes == {"w": ((160,), (130,), (1,)), "b": ((1,), (1,), (130,)),
                      "w3": ((2, 12), (2, 8), (1,)), "w4": ((16, 3), (16, 5), (1,))}
    assert adafactor.m["w"].shape == (1,)  # no momentum by default (beta1 0)
    full = Adafactor(factored=False, beta1=0.9).build().init(_params())
    [full] = [s for s in full if isinstance(s, AdafactorState)]
    assert full.v["w"].shape == (160, 130) and full.m["w"].shape == (160, 130)


def test_adafactor_with_pow_decay_matches_optax_adafactor():
    """Where the two agree by construction (no momentum, both dimensions >= 128 so that Optax
    factors too), Optax's own Adafactor is the independent reference."""
    params = {k: v for k, v in _params().items() if k in ("w", "b")}
    ours, _ = _run(Adafactor(learning_rate=0.01, decay_method="pow", decay_pow=0.8,
                             multiply_by_parameter_scale=True).build(), params, 6)
    theirs, _ = _run(optax.adafactor(learning_rate=0.01, decay_rate=0.8,
                                     multiply_by_parameter_scale=True, clipping_threshold=1.0,
                                     eps=1e-30), params, 6)
    for name in params:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=2e-5, atol=1e-7)
    assert not np.allclose(ours["w"], params["w"])


def _reference_adafactor(params, steps, *, lr_at, decay_adam, beta1, weight_decay):
    """Pax's ShardedAdafactor step by step in NumPy: adam decay with bias correction, factored
    over the last two axes, update clipping 1.0, momentum over the lr-scaled update."""
    params = {k: np.asarray(v, np.float64) for k, v in params.items()}
    slots = {k: {"m": np.zeros_like(p), "r": None, "c": None, "v": None}
             for k, p in params.items()}
    for step in range(steps):
        t = step + 1.0
        decay = decay_adam * (1 - decay_adam ** (t - 1)) / (1 - decay_adam ** t)
        lr = lr_at(step)
        grads = {k: np.asarray(g, np.float64) for k, g in _grads(step, params).items()}
        for name, p in params.items():
            g, s = grads[name], slots[name]
            g2 = g * g + 1e-30
            if p.ndim >= 2:
                r, c = g2.mean(axis=-1), g2.mean(axis=-2)
                s["r"] = (1 - decay) * r if s["r"] is None else decay * s["r"] + (1 - decay) * r
                s["c"] = (1 - decay) * c if s["c"] is None else decay * s["c"] + (1 - decay) * c
                v = (s["r"][..., :, None] * s["c"][..., None, :]
                     / s["r"].mean(axis=-1)[..., None, None])
            else:
                s["v"] = (1 - decay) * g2 if s["v"] is None else decay * s["v"] + (1 - decay) * g2
                v = s["v"]
            x = g / np.sqrt(v)
            x = x / max(1.0, np.sqrt(np.mean(x * x)))
            s["m"] = beta1 * s["m"] + (1 - beta1) * lr * x
            params[name] = p - (s["m"] + weight_decay * lr * p)
    return params


def test_adafactor_with_adam_decay_and_momentum_follows_pax_formulas():
    schedule = LinearRampupCosineDecay(warmup_steps=3, decay_start=3, decay_end=8, min_ratio=0.1)
    optimizer = Adafactor(learning_rate=0.02, lr_schedule=schedule, decay_method="adam",
                          decay_adam=0.99, beta1=0.9, weight_decay=0.01)
    params = _params()
    ours, _ = _run(optimizer.build(), params, 7)
    want = _reference_adafactor(params, 7, lr_at=lambda s: float(optimizer.learning_rate_at(s)),
                                decay_adam=0.99, beta1=0.9, weight_decay=0.01)
    for name in params:
        np.testing.assert_allclose(ours[name], want[name], rtol=1e-4, atol=1e-6)


def test_optimizer_state_takes_the_axes_of_its_parameter():
    boxed = {"w": nn.Partitioned(jnp.zeros((4, 8)), names=("embed", "mlp")),
             "b": nn.Partitioned(jnp.zeros((8,)), names=("mlp",))}
    params = nn.meta.unbox(boxed)
    tx = optax.chain(optax.masked(optax.adam(1e-3), {"w": True, "b": False}),
                     Adafactor(beta1=0.9).build())
    axes = logical_axes(TrainState(boxed, tx.init(params), jnp.zeros(()), jnp.zeros(())))
    masked_adam, (adafactor,) = axes.opt_state[0].inner_state[0], axes.opt_state[1]
    assert masked_adam.mu["w"] == PartitionSpec("embed", "mlp")  # masked states too
    assert adafactor.m["w"] == PartitionSpec("embed", "mlp")
    assert adafactor.v["b"] == PartitionSpec("mlp")
    assert adafactor.v_row["w"] == PartitionSpec() == adafactor.count  # factored: replicated


def test_lion_moves_every_weight_by_the_learning_rate():
    params = _params()
    moved, _ = _run(Lion(learning_rate=1e-3).build(), params, 1)
    for name in params:
        np.testing.assert_allclose(np.abs(moved[name] - params[name]), 1e-3, rtol=1e-3)
    clipped, _ = _run(Lion(learning_rate=1e-3, update_clip_threshold=0.5).build(), params, 1)
    np.testing.assert_allclose(np.abs(clipped["w"] - params["w"]), 0.5e-3, rtol=1e-3)


def test_ema_averages_the_parameters_each_step_starts_from():
    params = {"w": jnp.arange(4.0)}
    tx = Sgd(learning_rate=0.1, ema_decay=0.9).build()
    state, p, expected = tx.init(params), params, np.arange(4.0)
    for step in range(30):
        rate = min(0.9, (1 + step) / (10 + step))
        expected = expected - (1 - rate) * (expected - np.asarray(p["w"]))
        updates, state = tx.update({"w": p["w"] - 1.0}, state, p)  # pulls every weight to 1
        p = optax.apply_updates(p, updates)
    ema = ema_params(TrainState(p, state, jnp.zeros(()), jnp.zeros(())))["w"]
    np.testing.assert_allclose(ema, expected, rtol=1e-6)
    assert not np.allclose(ema, p["w"])
    assert ema_params(TrainState(p, Adam().build().init(p), jnp.zeros(()), jnp.zeros(()))) is None


ADAFACTOR = "OPTIMIZER=adafactor"
# Settings pax train refuses before it starts, and what the refusal says.
REFUSED = [
    ([ADAFACTOR, "task.train.learner.optimizer.ema_decay=1.0"], "ema_decay must be in [0, 1)"),
    ([ADAFACTOR, "task.train.learner.optimizer.decay_method='exp'"],
     "decay_method must be one of adam, pow"),
    ([ADAFACTOR, "task.train.learner.optimizer.decay_adam=1.5"], "decay_adam must be in (0, 1)"),
    (["OPTIMIZER=adamw"], "OPTIMIZER 'adamw' is not one of adam, adafactor, lion, sgd (did you "
                          "mean adam?)"),
    (["LR_SCHEDULE=cosin"], "LR_SCHEDULE 'cosin' is not one of constant, "),
]


def test_a_bad_optimizer_setting_is_one_line(tmp_path):
    """Through the ``pax`` command; every refused setting is the next test's."""
    items, message = REFUSED[0]
    result = run_pax("train", "--exp", "MlpSynthetic", "--job-dir", str(tmp_path / "job"),
                     *(a for item in items for a in ("--set", item)))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "job").exists()


@pytest.mark.parametrize(("items", "message"), REFUSED,
                         ids=["ema_decay", "decay_method", "decay_adam", "optimizer", "schedule"])
def test_bad_optimizer_settings_and_names_are_refused_before_anything_is_written(
        tmp_path, capfd, items, message):
    """``pax train`` in this process: the usage error (exit 2) the command prints as its one
    line, and nothing else said (the test above)."""
    with pytest.raises(UsageError) as refused:
        train(isolated_host(), exp="MlpSynthetic", plugin=None, set_items=items,
              job_dir=str(tmp_path / "job"))
    assert message in str(refused.value) and "\n" not in str(refused.value)
    assert refused.value.exit_code == 2 and capfd.readouterr().err == ""
    assert not (tmp_path / "job").exists()


def test_the_conformance_suite_tries_every_optimizer_of_the_table():
    assert list(LEARNING_RATES) == list(OPTIMIZERS)


@pytest.mark.parametrize("optimizer", list(LEARNING_RATES))
def test_each_optimizer_trains_the_mlp(optimizer):
    losses = first_batch_losses(
        isolated_host(), "MlpSynthetic", None,
        [f"OPTIMIZER={optimizer}", "LR_SCHEDULE=constant",
         f"LEARNING_RATE={LEARNING_RATES[optimizer]}"], steps=TRAIN_STEPS)
    assert going_down(losses), losses


def test_a_constant_the_chosen_optimizer_does_not_read_is_named(tmp_path):
    result = run_pax("config", "--exp", "MlpSynthetic", "--set", "ADAFACTOR_BETA1=0.5",
                     "--set", "LION_BETA1=0.5", "--set", "ADAM_BETA1=0.8")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        f"pax: warning: --set {name} changes nothing: experiment core/MlpSynthetic trains with "
        f"OPTIMIZER adam and LR_SCHEDULE linear_rampup_cosine_decay, which do not read it"
        for name in ("ADAFACTOR_BETA1", "LION_BETA1")]
    assert "beta1 = 0.8" in result.stdout


# A short run that evaluates and saves twice, keeping a moving average of the parameters.
EMA_RUN = ["--exp", "MlpSynthetic", "--set", "NUM_TRAIN_STEPS=40",
           "--set", "EVAL_INTERVAL_STEPS=20", "--set", "CHECKPOINT_EVERY_N_STEPS=20"]


@pytest.mark.slow
def test_eval_export_and_checkpoint_use_the_ema(tmp_path):
    job = tmp_path / "job"
    result = run_pax("train", *EMA_RUN, "--job-dir", str(job), "--set", "EMA_DECAY=0.9",
                     "--set", "EVAL_USE_EMA_STATES=True")
    assert result.returncode == 0, result.stderr
    in_training = [r for r in read_metrics(job) if r["kind"] == "eval/test"][-1]
    ema_eval = run_pax("eval", "--job-dir", str(job), "--json")
    plain_eval = run_pax("eval", "--job-dir", str(job), "--json",
                         "--set", "task.train.eval_use_ema_states=False")
    assert ema_eval.returncode == 0 and plain_eval.returncode == 0, ema_eval.stderr
    ema_loss = json.loads(ema_eval.stdout)["eval"]["test"]["loss"]
    plain_loss = json.loads(plain_eval.stdout)["eval"]["test"]["loss"]
    assert ema_loss == pytest.approx(in_training["loss"], rel=1e-6)
    assert ema_loss != pytest.approx(plain_loss, rel=1e-4)
    exported = run_pax("export", "--job-dir", str(job), "--output", str(tmp_path / "out"))
    assert exported.returncode == 0, exported.stderr
    record = json.loads((tmp_path / "out" / "export.json").read_text())
    assert record["ema"] is True
    # The checkpoint keeps the average (in the optimizer state); the export is that average.
    checkpoints = job / "checkpoints"
    step = max(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
    with ocp.StandardCheckpointer() as reader:
        saved = reader.restore(checkpoints / str(step) / "state")
        exported_params = reader.restore(tmp_path / "out" / "params")
    [average] = [s["ema"] for s in saved["opt_state"] if isinstance(s, dict) and "ema" in s]
    for got, want in zip(jax.tree.leaves(exported_params), jax.tree.leaves(average), strict=True):
        np.testing.assert_array_equal(got, want)
    assert not np.array_equal(read_params(job)["['Dense_0']['kernel']"],
                              average["Dense_0"]["kernel"])


def test_evaluating_an_ema_the_optimizer_does_not_keep_is_refused(tmp_path):
    result = run_pax("train", *EMA_RUN, "--job-dir", str(tmp_path / "job"),
                     "--set", "EVAL_USE_EMA_STATES=True")
    assert result.returncode == 2
    assert "set task.train.learner.optimizer.ema_decay" in result.stderr
    assert not (tmp_path / "job").exists()
