"""Precision policies: what the compiled step computes in, what the state stores, what is reported."""

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from sklearn.datasets import load_digits

from ember import Events
from ember.data import ArrayDataset
from ember.handlers import Checkpoint
from ember.metrics import Accuracy
from ember.training import (
    DynamicLossScale,
    TrainState,
    create_evaluator,
    create_supervised_trainer,
    create_trainer,
    ema,
    ema_params,
    make_train_step,
)
from tests.training.models import DigitsMLP, xent_loss


def _state():
    return TrainState.from_linen(DigitsMLP(), jnp.ones((8, 64)), optax.adam(1e-2))


BATCH = {"x": jax.random.normal(jax.random.PRNGKey(1), (8, 64)), "y": jnp.arange(8) % 10}


def _dot_types(precision):
    lowered = jax.jit(make_train_step(xent_loss, precision=precision)).lower(_state(), BATCH).as_text()
    return re.findall(r"stablehlo\.dot_general .*-> tensor<[^>]*x(\w+)>", lowered)


def test_bf16_mixed_runs_every_matrix_product_in_bfloat16():
    """Two layers: 2 products forward, 3 backward; all bfloat16 under "bf16-mixed", all float32 by default."""
    assert _dot_types("32-true") == ["f32"] * 5
    assert _dot_types("bf16-mixed") == ["bf16"] * 5


def test_bf16_mixed_keeps_the_master_copy_and_reports_in_float32():
    trainer = create_trainer(_state(), xent_loss, precision="bf16-mixed", extras=("grad_norm",))
    out = trainer.run([BATCH] * 3).output
    state = trainer.state.train_state
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype("float32")}
    assert {x.dtype for x in jax.tree.leaves(state.opt_state) if x.ndim} == {jnp.dtype("float32")}
    assert (out["loss"].dtype, out["grad_norm"].dtype) == (jnp.float32, jnp.float32)


def test_bf16_mixed_reaches_the_float32_accuracy_on_the_digits():
    """The digits, 20 epochs of an MLP: validation accuracy within 0.5% of the float32 run."""
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    train = ArrayDataset({"x": x[:1400], "y": y[:1400]}, batch_size=50, shuffle=True, seed=0)
    val = ArrayDataset({"x": x[1400:], "y": y[1400:]}, batch_size=397)
    accuracy = {}
    for precision in ("32-true", "bf16-mixed"):
        trainer = create_trainer(_state(), xent_loss, precision=precision)
        evaluator = create_evaluator(trainer, lambda m, b: {"y_pred": m(b["x"]), "y": b["y"]}, precision=precision)
        Accuracy().attach(evaluator, "accuracy")
        trainer.run(train, max_epochs=20)
        accuracy[precision] = evaluator.run(val).metrics["accuracy"]
    assert accuracy["32-true"] > 0.9
    assert abs(accuracy["bf16-mixed"] - accuracy["32-true"]) <= 0.005


def test_bf16_true_stores_the_state_in_bfloat16_and_reports_the_loss_in_float32():
    trainer = create_trainer(_state(), xent_loss, precision="bf16-true")
    out = trainer.run([BATCH] * 3).output
    state = trainer.state.train_state
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype("bfloat16")}
    floats = {x.dtype for x in jax.tree.leaves(state.opt_state) if jnp.issubdtype(x.dtype, jnp.floating)}
    assert floats == {jnp.dtype("bfloat16")}
    assert out["loss"].dtype == jnp.float32
    assert int(state.step) == 3


def test_bf16_true_builds_a_lazy_state_in_bfloat16():
    """A state built from the first batch (create_supervised_trainer's) is stored as the policy keeps it."""
    trainer = create_supervised_trainer(
        DigitsMLP(),
        optax.sgd(0.1),
        lambda p, y: optax.softmax_cross_entropy_with_integer_labels(p, y).mean(),
        precision="bf16-true",
    )
    trainer.run([(BATCH["x"], BATCH["y"])])
    assert {x.dtype for x in jax.tree.leaves(trainer.state.train_state.params)} == {jnp.dtype("bfloat16")}


def test_the_compiled_step_computes_in_each_policys_dtype():
    """Two layers: 2 products forward, 3 backward, each in the policy's compute dtype."""
    lowered = {}
    for precision in ("bf16-true", "16-mixed"):
        trainer = create_trainer(_state(), xent_loss, precision=precision)
        state = trainer.state.train_state
        step = make_train_step(xent_loss, precision=precision)
        text = jax.jit(step).lower(state, BATCH).as_text()
        lowered[precision] = re.findall(r"stablehlo\.dot_general .*-> tensor<[^>]*x(\w+)>", text)
    assert lowered == {"bf16-true": ["bf16"] * 5, "16-mixed": ["f16"] * 5}


def _poisoned(steps, at):
    """``steps`` batches; those at the indices in ``at`` hold 1e5, past float16's largest value (65504)."""
    batches = []
    for i in range(steps):
        x = np.array(BATCH["x"])
        if i in at:
            x[0, 0] = 1e5
        batches.append({"x": x, "y": np.asarray(BATCH["y"])})
    return batches


def _recording(trainer):
    seen = []

    def record(engine):
        out = engine.state.output
        params = jax.device_get(engine.state.train_state.params)
        seen.append((float(out["loss_scale"]), int(out["skipped"]), params, int(out["skip_reason"]) > 0))

    trainer.add_event_handler(Events.ITERATION_COMPLETED, record)
    return seen


def test_16_mixed_skips_exactly_the_steps_whose_gradients_overflow():
    """Steps 3 and 7 (1-based) overflow: their updates are skipped, the scale halves after each, and only then.

    The skips are the step guard's that "16-mixed" adds; the step counter counts applied updates.
    """
    trainer = create_trainer(_state(), xent_loss, precision="16-mixed")
    seen = _recording(trainer)
    trainer.run(_poisoned(8, at=(2, 6)))
    assert [overflow for *_, overflow in seen] == [i in (2, 6) for i in range(8)]
    assert [(scale, skipped) for scale, skipped, *_ in seen] == [
        (32768.0, 0),
        (32768.0, 0),
        (32768.0, 1),
        (16384.0, 1),
        (16384.0, 1),
        (16384.0, 1),
        (16384.0, 2),
        (8192.0, 2),
    ]
    params = [p for _, _, p, _ in seen]
    for i in range(1, 8):
        pairs = zip(jax.tree.leaves(params[i]), jax.tree.leaves(params[i - 1]), strict=True)
        assert all(np.array_equal(a, b) for a, b in pairs) == (i in (2, 6)), i
    state = trainer.state.train_state
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype("float32")}
    assert (int(state.step), int(state.guard.skipped)) == (6, 2)  # the step counts applied updates


def test_16_mixed_grows_the_scale_after_a_period_of_finite_steps():
    state = _state().replace(loss_scale=DynamicLossScale.create(initial=4.0, period=3))
    trainer = create_trainer(state, xent_loss, precision="16-mixed")
    seen = _recording(trainer)
    trainer.run([BATCH] * 7)
    assert [scale for scale, *_ in seen] == [4.0, 4.0, 4.0, 8.0, 8.0, 8.0, 16.0]


def _straight_and_resumed(tmp_path, precision, data, stop):
    """A run straight over ``data``, and a new trainer resumed from the checkpoint of a run stopped at ``stop``.

    Returns ``(straight, resumed, info)``; ``resumed`` has not trained on yet.
    """
    straight = create_trainer(_state(), xent_loss, precision=precision)
    straight.run(data)
    first = create_trainer(_state(), xent_loss, precision=precision)
    Checkpoint({"trainer": first}, tmp_path, n_saved=None).attach(first, Events.ITERATION_COMPLETED(once=stop))
    first.add_event_handler(Events.ITERATION_COMPLETED(once=stop), lambda e: e.terminate(final=False))
    first.run(data)
    resumed = create_trainer(_state(), xent_loss, precision=precision)
    return straight, resumed, Checkpoint({"trainer": resumed}, tmp_path).resume()


def test_16_mixed_resumes_bit_exact_with_its_loss_scale(tmp_path):
    """Ten steps straight equal five, a checkpoint, a new trainer restored from it, and five more."""
    data = _poisoned(10, at=(3, 7))
    straight, resumed, _ = _straight_and_resumed(tmp_path, "16-mixed", data, stop=5)
    assert float(resumed.state.train_state.loss_scale.scale) == 16384.0
    resumed.run(data)
    a, b = straight.tree_state_dict(), resumed.tree_state_dict()
    assert sorted(a) == sorted(b)
    assert "loss_scale.scale" in a
    for name in a:
        assert np.array_equal(a[name], b[name]), name
    b = resumed.state.train_state
    assert (float(b.loss_scale.scale), int(b.guard.skipped)) == (8192.0, 2)


def test_bf16_true_resumes_bit_exact_through_a_background_checkpoint(tmp_path):
    """A bfloat16 train state (parameters and Adam moments) is saved and restored as it was.

    Six steps straight equal three, a checkpoint written in the background, a new trainer restored from it, and three
    more.
    """
    data = [BATCH] * 6
    straight, resumed, info = _straight_and_resumed(tmp_path, "bf16-true", data, stop=3)
    assert info.step == 3
    resumed.run(data)
    a, b = straight.tree_state_dict(), resumed.tree_state_dict()
    assert {np.asarray(b[name]).dtype.name for name in b if name.startswith("params")} == {"bfloat16"}
    for name in a:
        assert np.array_equal(np.asarray(a[name]), np.asarray(b[name])), name


def test_an_unknown_policy_is_refused_by_name():
    with pytest.raises(
        ValueError,
        match=re.escape("`precision` must be one of ['32-true', 'bf16-mixed', 'bf16-true', '16-mixed'], got 'bf16'."),
    ):
        create_trainer(_state(), xent_loss, precision="bf16")


def test_a_loss_scale_is_checked_when_made():
    with pytest.raises(ValueError, match=re.escape("`period` must be an int >= 1, got 0.")):
        DynamicLossScale.create(period=0)
    with pytest.raises(ValueError, match=re.escape("`initial` must be a positive number, got -1.0.")):
        DynamicLossScale.create(initial=-1.0)


def test_16_mixed_leaves_the_weight_average_alone_on_a_skipped_step():
    """The EMA lives in the optimizer state, which a skipped step keeps: it moves on the applied steps only."""
    state = TrainState.from_linen(DigitsMLP(), jnp.ones((8, 64)), ema(optax.adam(1e-2), momentum=0.5))
    trainer = create_trainer(state, xent_loss, precision="16-mixed")
    averages = []
    trainer.add_event_handler(
        Events.ITERATION_COMPLETED, lambda e: averages.append(jax.device_get(ema_params(e.state.train_state)))
    )
    trainer.run(_poisoned(3, at=(1,)))
    same = [
        all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(x), jax.tree.leaves(y), strict=True))
        for x, y in itertools.pairwise(averages)
    ]
    assert same == [True, False]
    evaluator = create_evaluator(trainer, lambda m, b: m(b["x"]), use_ema=True, precision="16-mixed")
    assert evaluator.run([BATCH]).output.dtype == jnp.float32


def test_the_loss_scale_halves_on_overflow_down_to_its_minimum_and_never_below():
    """From 8 with minimum 2: overflows give 4, 2, then 2 again (the minimum itself is reached, not passed)."""
    scale = DynamicLossScale.create(initial=8.0, period=100, minimum=2.0)
    seen = []
    for _ in range(4):
        scale = scale.adjust(jnp.asarray(False))
        seen.append(float(scale.scale))
    assert seen == [4.0, 2.0, 2.0, 2.0]
    odd = DynamicLossScale.create(initial=6.0, period=100, minimum=4.0).adjust(jnp.asarray(False))
    assert float(odd.scale) == 4.0  # 6 / 2 = 3 is below the minimum: held at 4
