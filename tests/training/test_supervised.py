import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx

from ember import Events
from ember.training import TrainState, create_supervised_evaluator, create_supervised_trainer


def mse(y_pred, y):
    return jnp.mean((y_pred - y) ** 2)


def regression_batches(n=4):
    rng = np.random.default_rng(0)
    out = []
    for _ in range(n):
        x = rng.normal(size=(8, 3)).astype(np.float32)
        out.append((x, x @ np.array([[1.0], [-2.0], [0.5]], np.float32)))
    return out


class Accuracy:
    """A small metric with Ignite's attach(engine, name): sums matches on device, reads once per run."""

    def attach(self, engine, name):
        engine.add_event_handler(Events.STARTED, self.reset)
        engine.add_event_handler(Events.ITERATION_COMPLETED, self.update)
        engine.add_event_handler(Events.COMPLETED, lambda e: e.state.metrics.__setitem__(name, self.compute()))

    def reset(self):
        self.correct, self.total = jnp.zeros(()), 0

    def update(self, engine):
        out = engine.state.output
        self.correct = self.correct + jnp.sum(jnp.argmax(out["y_pred"], -1) == out["y"])
        self.total += out["y"].shape[0]

    def compute(self):
        return float(self.correct) / self.total


def test_linen_model_is_initialised_from_the_first_batch_and_trains():
    """A linen module needs no sample input; the loss falls and the output holds loss, y_pred, y."""
    trainer = create_supervised_trainer(nn.Dense(1), optax.adam(0.1), mse)
    losses = []
    trainer.add_event_handler(Events.EPOCH_COMPLETED, lambda e: losses.append(float(e.state.output["loss"])))
    state = trainer.run(regression_batches(), max_epochs=30)
    assert sorted(state.output) == ["loss", "y", "y_pred"]
    assert losses[-1] < 0.01 < losses[0]


def test_nnx_model_and_train_state_are_accepted():
    """An NNX module and a ready TrainState both train through the shortcut."""
    nnx_trainer = create_supervised_trainer(nnx.Linear(3, 1, rngs=nnx.Rngs(0)), optax.adam(0.1), mse)
    assert int(nnx_trainer.run(regression_batches(), max_epochs=2).train_state.step) == 8
    state = TrainState.create(lambda p, x: x @ p, jnp.zeros((3, 1)), optax.sgd(0.1))
    ts_trainer = create_supervised_trainer(state, optax.sgd(99.0), mse)
    assert int(ts_trainer.run(regression_batches()).train_state.step) == 4


def test_supervised_evaluator_attaches_metrics_and_follows_the_trainer():
    """Metrics attached through the shortcut see {"y_pred", "y"} and land in state.metrics."""
    params = jnp.array([[5.0, 0.0], [0.0, 5.0]])
    state = TrainState.create(lambda p, x: x @ p, params, optax.sgd(0.1))
    evaluator = create_supervised_evaluator(state, metrics={"accuracy": Accuracy()})
    x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]], np.float32)
    evaluator.run([(x, np.array([0, 1, 1, 1]))])
    assert evaluator.state.metrics == {"accuracy": 0.75}


def test_supervised_errors():
    """Wrong model types, loss functions, batches and metrics are refused clearly."""
    with pytest.raises(
        TypeError,
        match=r"`model` must be a flax.linen.Module, a flax.nnx.Module, .*, got builtins.str\.",
    ):
        create_supervised_trainer("mlp", optax.sgd(0.1), mse)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"`loss_fn` must be callable as loss_fn\(y_pred, y\)"):
        create_supervised_trainer(nn.Dense(1), optax.sgd(0.1), None)  # type: ignore[arg-type]
    trainer = create_supervised_trainer(nn.Dense(1), optax.sgd(0.1), mse)
    with pytest.raises(TypeError, match=r"Supervised engines take \(x, y\) batches; got a dict"):
        trainer.run([{"x": np.ones((2, 3))}])
    state = TrainState.create(lambda p, x: x, jnp.zeros(1), optax.sgd(0.1))
    with pytest.raises(TypeError, match=r"Metric 'acc' has no attach\(engine, name\) method; got int"):
        create_supervised_evaluator(state, metrics={"acc": 3})


NOT_BUILT = (
    "This trainer has no train state yet: it builds it from the first batch. To resume before the first run, "
    "build it from a sample first: trainer.build_state(next(iter(data))), then Checkpoint.resume() or load_objects()."
)


def test_a_trainer_built_from_the_first_batch_resumes_after_build_state(tmp_path):
    """resume() before the first run says what to do; after build_state(sample) it restores exactly."""
    from ember.handlers import Checkpoint

    data = regression_batches()
    straight = create_supervised_trainer(nn.Dense(1), optax.adam(0.1), mse)
    straight.run(data, max_epochs=2)
    first = create_supervised_trainer(nn.Dense(1), optax.adam(0.1), mse)
    Checkpoint({"trainer": first}, tmp_path, background=False).attach(first, Events.EPOCH_COMPLETED)
    first.run(data, max_epochs=1)

    lazy = create_supervised_trainer(nn.Dense(1), optax.adam(0.1), mse)
    with pytest.raises(RuntimeError, match=re.escape(NOT_BUILT)):
        Checkpoint({"trainer": lazy}, tmp_path).resume()
    assert lazy.state.iteration == 0  # nothing was changed
    lazy.build_state(data[0])
    assert Checkpoint({"trainer": lazy}, tmp_path).resume().step == 4
    lazy.run(data, max_epochs=2)
    for a, b in zip(jax.tree.leaves(lazy.state.train_state), jax.tree.leaves(straight.state.train_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
